package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/telemetry"
)

func serve(ctx context.Context, args []string) error {
	flags, err := parseServe(args)
	if err != nil {
		return err
	}
	logs := telemetry.NewLogHandler(os.Stderr, telemetry.LogConfig{})
	defer logs.CloseWithTimeout()
	log := slog.New(logs)
	a, err := app.New(flags.cfg, log)
	if err != nil {
		return err
	}
	defer a.Close()
	grpcLis, httpLis, err := a.Listen()
	if err != nil {
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go reloadOnHangup(ctx, hup, a, flags.configPath, log)
	return a.Serve(ctx, grpcLis, httpLis)
}

// reloadOnHangup reloads the admission budgets from the config file on
// each SIGHUP until ctx ends. A file that does not load keeps the budgets
// in force; the error is logged.
func reloadOnHangup(ctx context.Context, hup <-chan os.Signal, a *app.App, path string, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		if path == "" {
			log.Warn("SIGHUP: no --config file was given; nothing to reload")
			continue
		}
		if err := a.ReloadAdmission(path); err != nil {
			log.Error("SIGHUP: keeping the budgets in force", "file", path, "err", err)
		}
	}
}
