package posts

import (
	"context"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
)

// Allowed: tests start goroutines and use errgroups freely.
func TestFree(t *testing.T) {
	go func() {}()
	time.AfterFunc(time.Millisecond, func() {})
	g, _ := errgroup.WithContext(context.Background())
	g.Go(func() error { return nil })
	_ = g.Wait()
	Laundered()
}

// But a test may not register services: that would bypass the guard.
func TestRegisters(t *testing.T) {
	_ = grpc.NewServer() // want `register: grpc.NewServer in internal/posts.TestRegisters`
}
