// Binary sluice-peer serves the benchmarks' bare peer (package
// bench/peer): sluice.v1.PostRecords' read methods over grpc-go and
// gomemcache with nothing else. It is for `make bench` only.
//
//	sluice-peer --memcached 127.0.0.1:11211 --grpc-addr 127.0.0.1:50071 --max-idle 64
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluice-dev/sluice/bench/peer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "sluice-peer:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sluice-peer", flag.ContinueOnError)
	mc := fs.String("memcached", "127.0.0.1:11211", "one memcached server")
	grpcAddr := fs.String("grpc-addr", "127.0.0.1:50071", "gRPC listen address")
	maxIdle := fs.Int("max-idle", 64, "gomemcache idle connections kept")
	if err := fs.Parse(args); err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *grpcAddr)
	if err != nil {
		return err
	}
	srv := peer.NewServer(peer.New(*mc, *maxIdle))
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		srv.GracefulStop()
	}()
	fmt.Fprintf(os.Stderr, "sluice-peer serving gRPC on %s (memcached %s)\n", *grpcAddr, *mc)
	if err := srv.Serve(lis); err != nil {
		return err
	}
	<-stopped
	return nil
}
