// Binary sluice-naive serves the benchmarks' naive baseline (package
// bench/naive): the sluice.v1 API with one goroutine per URI, an
// uncapped gomemcache pool with 1,000 idle connections, and every cache
// error logged. It is for `make bench` only.
//
//	sluice-naive --data-dir DIR --memcached 127.0.0.1:11211 --grpc-addr 127.0.0.1:50061 --http-addr 127.0.0.1:8081 --log FILE
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sluice-dev/sluice/bench/naive"
	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/store/boltstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "sluice-naive:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sluice-naive", flag.ContinueOnError)
	dataDir := fs.String("data-dir", ".data", "directory of the embedded store (as sluice seed wrote it)")
	mc := fs.String("memcached", "127.0.0.1:11211", "one memcached server")
	grpcAddr := fs.String("grpc-addr", "127.0.0.1:50061", "gRPC listen address")
	httpAddr := fs.String("http-addr", "127.0.0.1:8081", "/metrics listen address")
	logPath := fs.String("log", "", "file every cache error is logged to (default stderr)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logOut := os.Stderr
	if *logPath != "" {
		f, err := os.Create(*logPath)
		if err != nil {
			return err
		}
		defer f.Close()
		logOut = f
	}
	st, err := boltstore.Open(filepath.Join(*dataDir, app.StoreFile), boltstore.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	svc := naive.New(*mc, st, log.New(logOut, "", log.LstdFlags|log.Lmicroseconds))
	srv, err := naive.NewServer(svc)
	if err != nil {
		return err
	}
	grpcLis, err := net.Listen("tcp", *grpcAddr)
	if err != nil {
		return err
	}
	httpSrv := &http.Server{Addr: *httpAddr, Handler: svc.Metrics(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = httpSrv.ListenAndServe() }()
	go func() {
		<-ctx.Done()
		drain, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = httpSrv.Shutdown(drain)
		srv.Drain(drain)
	}()
	srv.SetServing(true)
	fmt.Fprintf(os.Stderr, "sluice-naive serving gRPC on %s, /metrics on %s (one goroutine per URI, gomemcache MaxIdleConns %d)\n", *grpcAddr, *httpAddr, naive.MaxIdleConns)
	return srv.Serve(grpcLis)
}
