package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/telemetry"
)

func serve(ctx context.Context, args []string) error {
	cfg, err := parseServeFlags(args)
	if err != nil {
		return err
	}
	logs := telemetry.NewLogHandler(os.Stderr, telemetry.LogConfig{})
	defer logs.CloseWithTimeout()
	a, err := app.New(cfg, slog.New(logs))
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
