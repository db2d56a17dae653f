package app

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"
)

// Tests that Serve stops, drained, when one of its servers fails instead
// of serving on half-started (readiness reported, the gRPC server gone)
// until the process is signalled.
func TestServeStopsWhenAServerFails(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Cache.Servers = []string{"127.0.0.1:1"}
	cfg.Journal.Disabled = true
	cfg.DrainTimeout = time.Second
	a, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	grpcLis, httpLis, err := a.Listen()
	if err != nil {
		t.Fatal(err)
	}
	grpcLis.Close() // the gRPC server fails at once
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, grpcLis, httpLis) }()
	select {
	case err := <-served:
		if err == nil {
			t.Error("Serve returned no error after its gRPC server failed")
		}
	case <-time.After(10 * time.Second):
		cancel()
		<-served
		t.Fatal("Serve went on 10s after its gRPC server failed")
	}
}
