package guard_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Tests that Register on a server already serving changes nothing the
// requests in flight read: it is refused, leaves no policy behind for
// methods the server does not serve, and does not write the method table
// while requests read it.
func TestRegisterWhileServingChangesNothing(t *testing.T) {
	srv, err := guard.New(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("health check: %v", err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = health.Check(ctx, &healthpb.HealthCheckRequest{})
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	if err := srv.Register(&sluicev1.PostRecords_ServiceDesc, newPostRecords()); err == nil {
		t.Error("Register succeeded on a server already serving")
	}
	time.Sleep(20 * time.Millisecond)
	close(stop)
	wg.Wait()
	if p, ok := srv.Policy("/" + getMany); ok {
		t.Errorf("after a refused Register the server reports policy %+v for a method it does not serve", p)
	}
	srv.Drain(context.Background())
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}
