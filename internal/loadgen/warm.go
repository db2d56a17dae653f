package loadgen

import (
	"context"
	"fmt"
	"io"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// WarmClient is the x-client-id of warm-up reads.
const WarmClient = "warmup"

// Warm reads every URI once through the server at target, in batches of
// batch with at most concurrency requests in flight, so that a run
// starts on a warm cache as production does. It reports progress to
// progress when not nil.
func Warm(ctx context.Context, target string, uris []string, batch, concurrency int, progress io.Writer) error {
	if batch < 1 || concurrency < 1 {
		return fmt.Errorf("loadgen: warm-up batch and concurrency must be at least 1, got %d and %d", batch, concurrency)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(512<<20)))
	if err != nil {
		return fmt.Errorf("loadgen: warm-up: connect to %s: %w", target, err)
	}
	defer conn.Close()
	client := sluicev1.NewPostRecordsClient(conn)
	ctx = metadata.AppendToOutgoingContext(ctx, "x-client-id", WarmClient)
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(concurrency)
	began := time.Now()
	for from := 0; from < len(uris); from += batch {
		chunk := uris[from:min(from+batch, len(uris))]
		g.Go(func() error {
			callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if _, err := client.GetPostRecords(callCtx, &sluicev1.GetPostRecordsRequest{Uris: chunk}); err != nil {
				return fmt.Errorf("loadgen: warm-up batch at %d: %w", from, err)
			}
			return nil
		})
		if progress != nil && (from/batch)%100 == 0 {
			fmt.Fprintf(progress, "warm-up: %d/%d URIs\n", from, len(uris))
		}
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if progress != nil {
		fmt.Fprintf(progress, "warm-up: %d URIs in %v\n", len(uris), time.Since(began).Round(time.Millisecond))
	}
	return nil
}
