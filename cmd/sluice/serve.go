package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/admin"
	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/posts"
	"github.com/sluice-dev/sluice/internal/rpc"
	"github.com/sluice-dev/sluice/internal/store/boltstore"
	"github.com/sluice-dev/sluice/internal/telemetry"
	"golang.org/x/sync/errgroup"
)

// storeFile is the embedded store's file name inside --data-dir.
const storeFile = "sluice.db"

func serve(ctx context.Context, args []string) error {
	cfg, err := parseServeFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	st, err := boltstore.Open(filepath.Join(cfg.DataDir, storeFile), boltstore.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	mc, err := cache.New(cfg.Cache)
	if err != nil {
		return err
	}
	defer mc.Close()
	tel, err := telemetry.New(cfg.Telemetry)
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())
	requests, err := tel.NewRequests()
	if err != nil {
		return err
	}
	if err := tel.ObserveCache(mc.Stats); err != nil {
		return err
	}

	srv, err := guard.New(cfg.Guard, guard.WithObserver(requests))
	if err != nil {
		return err
	}
	svc := posts.New(aturi.PostCollection, mc, st, posts.DefaultWriteLimits())
	if err := srv.Register(&sluicev1.PostRecords_ServiceDesc, rpc.NewPostRecords(svc, requests)); err != nil {
		return err
	}
	adm := admin.New(tel.Handler())
	return listenAndServe(ctx, log, cfg, srv, adm)
}

// listenAndServe runs the gRPC and admin servers until ctx ends, then
// drains: readiness drops first, in-flight requests get DrainTimeout.
func listenAndServe(ctx context.Context, log *slog.Logger, cfg serveConfig, srv *guard.Server, adm *admin.Server) error {
	grpcLis, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("listen gRPC on %s: %w", cfg.GRPCAddr, err)
	}
	httpLis, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		grpcLis.Close()
		return fmt.Errorf("listen admin HTTP on %s: %w", cfg.HTTPAddr, err)
	}
	log.Info("sluice serving", "grpc", grpcLis.Addr().String(), "admin", httpLis.Addr().String(),
		"memcached", cfg.Cache.Servers, "memcached_max_conns", cfg.Cache.MaxConnsPerServer,
		"data_dir", cfg.DataDir, "tls", false, "note", loopbackNote(cfg.GRPCAddr))

	g := new(errgroup.Group)
	g.SetLimit(3)
	g.Go(func() error { return srv.Serve(grpcLis) })
	g.Go(func() error { return adm.Serve(httpLis) })
	srv.SetServing(true)
	adm.SetReady(true)
	g.Go(func() error {
		<-ctx.Done()
		log.Info("sluice draining", "timeout", cfg.DrainTimeout)
		adm.SetReady(false)
		drainCtx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
		defer cancel()
		srv.Drain(drainCtx)
		shutdownCtx, cancel2 := context.WithTimeout(context.Background(), time.Second)
		defer cancel2()
		return adm.Shutdown(shutdownCtx)
	})
	err = g.Wait()
	log.Info("sluice stopped")
	return err
}

func loopbackNote(addr string) string {
	host, _, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return "listening on loopback only; without TLS sluice trusts every caller's claimed name"
	}
	return "listening beyond loopback without TLS; callers' names are not authenticated"
}
