package guard_test

import (
	"fmt"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
)

// Tests that the bytes of answers still queued on a connection that
// closes go back to the response ledger. grpc-go's writer drops such
// answers without freeing their buffers; a caller that asks and never
// reads, then hangs up, must not leave max_response_bytes held for good.
// A caller that gzips its requests is answered uncompressed, so its
// unread answers are held like anyone's.
func TestAnswersQueuedOnAClosedConnectionAreReleased(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []grpc.CallOption
	}{
		{"identity", nil},
		{"gzip request", []grpc.CallOption{grpc.UseCompressor(gzip.Name)}},
	} {
		t.Run(tc.name, func(t *testing.T) { unreadAnswersThenHangUp(t, tc.opts...) })
	}
}

func unreadAnswersThenHangUp(t *testing.T, opts ...grpc.CallOption) {
	impl := newPostRecords()
	impl.recordBytes = 400 // about 450 KB an answer, far over the 64 KB stream window
	f := start(t, testConfig(), impl)

	// A fixed window turns off window growth: the unread answers stay
	// queued in the server.
	conn, err := grpc.NewClient("passthrough:///"+f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := testContext(t, 10*time.Second)
	const asks = 3
	for range asks {
		stream, err := conn.NewStream(ctx, &grpc.StreamDesc{}, "/"+getMany, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.SendMsg(&sluicev1.GetPostRecordsRequest{Uris: uris(1000)}); err != nil {
			t.Fatal(err)
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() string {
		return fmt.Sprintf("%d answers served, the ledger holds %v", impl.calls.Load(), f.srv.MemoryStats().Responses.Held)
	}, func() bool { return impl.calls.Load() == asks && f.srv.MemoryStats().Responses.Held > 3*(1<<16) })
	// The answers are stuck behind the window: their bytes stay held
	// while the connection is open.
	time.Sleep(100 * time.Millisecond)
	if held := f.srv.MemoryStats().Responses.Held; held < 3*(1<<16) {
		t.Fatalf("the ledger holds %v with %d answers unread, want each answer's bytes held", held, asks)
	}

	conn.Close()
	waitFor(t, func() string {
		return fmt.Sprintf("the ledger still holds %v after the connection with the unread answers closed", f.srv.MemoryStats().Responses.Held)
	}, func() bool { return f.srv.MemoryStats().Responses.Held == 0 })
}

// Tests that a connection older than max_connection_age is sent GOAWAY
// and replaced while its client keeps calling, without a failed call:
// this bounds how long any connection can hold answers the transport
// dropped unfreed.
func TestConnectionsAreReplacedAtMaxAge(t *testing.T) {
	cfg := testConfig()
	cfg.MaxConnectionAge = time.Second
	f := start(t, cfg, newPostRecords())
	ctx := testContext(t, 20*time.Second)
	for begin := time.Now(); time.Since(begin) < 2500*time.Millisecond; time.Sleep(10 * time.Millisecond) {
		if _, err := f.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris(10)}); err != nil {
			t.Fatalf("a call while the connection aged out: %v", err)
		}
	}
	if accepted := f.srv.MemoryStats().Connections.Accepted; accepted < 2 {
		t.Fatalf("%d connections accepted over 2.5 s of calls with max_connection_age 1s, want the first replaced", accepted)
	}
}
