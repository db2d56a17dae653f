package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/sluice-dev/sluice/internal/app"
)

func serve(ctx context.Context, args []string) error {
	cfg, err := parseServeFlags(args)
	if err != nil {
		return err
	}
	a, err := app.New(cfg, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		return err
	}
	defer a.Close()
	grpcLis, httpLis, err := a.Listen()
	if err != nil {
		return err
	}
	return a.Serve(ctx, grpcLis, httpLis)
}
