package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"github.com/sluice-dev/sluice/internal/procs"
	"github.com/sluice-dev/sluice/internal/telemetry"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
)

func serve(ctx context.Context, args []string) error {
	// SIGHUP is caught from the start: its default action would kill a
	// server still opening its store. One that arrives before serving is
	// handled once the server serves.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	flags, err := parseServe(args)
	if err != nil {
		return err
	}
	if err := useFineGrainedBufferPool(); err != nil {
		return err
	}
	logs := telemetry.NewLogHandler(os.Stderr, telemetry.LogConfig{})
	defer logs.CloseWithTimeout()
	log := slog.New(logs)
	flags.cfg.AfterStoreWrite = killAfterStoreWrite(os.Getenv(killAfterStoreWriteEnv))
	plan := flags.cfg.MemoryPlan()
	membudget.Apply(plan.Limit, plan.GCPercent)
	log.Info("memory budget", "memory_limit", plan.Limit.String(), "from", plan.LimitSource,
		"gc_percent", gcPercentLogged(plan), "gc_percent_from", plan.GCSource,
		"max_request_bytes", plan.Requests.String(), "max_caller_request_bytes", plan.CallerRequests.String(),
		"max_response_bytes", plan.Responses.String(), "max_connections", plan.Connections,
		"max_streams", plan.Streams, "max_streams_per_connection", plan.StreamsPerConnection)
	a, err := app.New(flags.cfg, log)
	if err != nil {
		return err
	}
	defer a.Close()
	grpcLis, httpLis, err := a.Listen()
	if err != nil {
		return err
	}
	go reloadOnHangup(ctx, hup, a, args, flags.configPath, log)
	followSaturation(ctx, flags.cfg.Guard.SaturatedProcsPerCPU, a.Guard, log)
	return a.Serve(ctx, grpcLis, httpLis)
}

// followSaturation raises Go's processors to perCPU per CPU while the
// guard queues or sheds, and gives them back to Go once it is calm
// (package procs), until ctx ends; or, when the plan is for none, logs
// why.
func followSaturation(ctx context.Context, perCPU int, g *guard.Server, log *slog.Logger) {
	cfg, off := procs.Plan(cmp.Or(perCPU, procs.DefaultPerCPU), os.Getenv("GOMAXPROCS"))
	if off != "" {
		log.Info("processors", "gomaxprocs", runtime.GOMAXPROCS(0), "saturated", "unchanged", "because", off)
		return
	}
	now, cpus := runtime.GOMAXPROCS(0), runtime.NumCPU()
	n, ok := procs.SaturatedProcs(cfg.PerCPU, now, cpus)
	saturated := strconv.Itoa(n)
	if !ok {
		saturated = fmt.Sprintf("unchanged while Go runs %d processors on %d CPUs (a CPU quota)", now, cpus)
	}
	log.Info("processors", "gomaxprocs", now, "saturated", saturated, "per_cpu", cfg.PerCPU,
		"raise_after", cfg.RaiseAfter, "lower_after", cfg.LowerAfter)
	c := procs.New(cfg, func(raise bool) { setProcs(raise, cfg.PerCPU) })
	go procs.Run(ctx, c, procs.DefaultEvery, g.Saturation())
}

// setProcs raises GOMAXPROCS to perCPU times Go's own number, read at
// the raise so that it follows CPUs and quotas that change while
// serving, unless a CPU quota holds Go below the CPUs; lowering gives
// the number back to the runtime, which then follows them again.
func setProcs(raise bool, perCPU int) {
	if !raise {
		runtime.SetDefaultGOMAXPROCS()
		return
	}
	if n, ok := procs.SaturatedProcs(perCPU, runtime.GOMAXPROCS(0), runtime.NumCPU()); ok {
		runtime.GOMAXPROCS(n)
	}
}

// gcPercentLogged is the GOGC in force: the plan's, or the environment's
// as written when the plan leaves it alone.
func gcPercentLogged(plan guard.MemoryPlan) string {
	if plan.GCPercent == 0 {
		return os.Getenv("GOGC")
	}
	return strconv.Itoa(plan.GCPercent)
}

// useFineGrainedBufferPool gives gRPC a buffer pool with a tier at every
// power of two from 256 B to 1 MiB. gRPC's default has tiers at 256 B,
// 4, 16 and 32 KiB and 1 MiB, and zeroes the whole buffer on reuse: a
// 50-post response (tens of KiB) took a 1 MiB buffer and spent a tenth of
// the server's CPU clearing it. The pool is process-wide, so it is set
// here, once, before the server starts.
func useFineGrainedBufferPool() error {
	exponents := make([]uint8, 0, 13)
	for e := uint8(8); e <= 20; e++ {
		exponents = append(exponents, e)
	}
	pool, err := mem.NewBinaryTieredBufferPool(exponents...)
	if err != nil {
		return fmt.Errorf("gRPC buffer pool: %w", err)
	}
	experimental.SetDefaultBufferPool(pool)
	return nil
}

// reloadOnHangup reloads the admission budgets from the config file on
// each SIGHUP until ctx ends. A file that does not load keeps the budgets
// in force; the error is logged.
func reloadOnHangup(ctx context.Context, hup <-chan os.Signal, a *app.App, args []string, path string, log *slog.Logger) {
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
		if err := reload(a, args, path); err != nil {
			log.Error("SIGHUP: keeping the budgets in force", "file", path, "err", err)
		}
	}
}

// reload reads the config file again with the flags serve was started
// with, checks the whole as start-up does, and puts its budgets in force.
func reload(a *app.App, args []string, path string) error {
	next, err := parseServe(args)
	if err != nil {
		return err
	}
	return a.ReloadAdmission(next.cfg, path)
}

// killAfterStoreWriteEnv names a test hook: when set, a write of a URI
// containing its value kills the process with SIGKILL after the store
// acknowledged the write and before the cache is invalidated, the crash
// the invalidation journal must survive. Tests set it; nothing else
// should.
const killAfterStoreWriteEnv = "SLUICE_TEST_KILL_AFTER_STORE_WRITE"

func killAfterStoreWrite(marker string) func([]string) {
	if marker == "" {
		return nil
	}
	return func(uris []string) {
		for _, u := range uris {
			if strings.Contains(u, marker) {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
	}
}
