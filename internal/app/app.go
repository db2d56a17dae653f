// Package app assembles a sluice server from its parts — store, cache,
// telemetry, guard, services and the admin endpoints — and runs it until
// its context ends, then drains it.
//
// It holds no logic of its own beyond wiring and the order of start-up
// and shutdown; `sluice serve` and the end-to-end tests build servers
// only through it, so what the tests run is what operators run.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/sluice-dev/sluice/api/bsky"
	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/admin"
	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/bskyrpc"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/clientpage"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/identity"
	"github.com/sluice-dev/sluice/internal/journal"
	"github.com/sluice-dev/sluice/internal/nearcache"
	"github.com/sluice-dev/sluice/internal/opthread"
	"github.com/sluice-dev/sluice/internal/posts"
	"github.com/sluice-dev/sluice/internal/records"
	"github.com/sluice-dev/sluice/internal/rpc"
	"github.com/sluice-dev/sluice/internal/socialgraph"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/cqlstore"
	"github.com/sluice-dev/sluice/internal/telemetry"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// StoreFile is the embedded store's file name inside Config.DataDir.
const StoreFile = "sluice.db"

// storeOpenTimeout bounds connecting to the store at start-up.
const storeOpenTimeout = 30 * time.Second

// App is one assembled sluice server.
type App struct {
	cfg Config
	log *slog.Logger
	// postOpts are every posts.Service's options: the logger and the
	// refused-values counter.
	postOpts []posts.Option
	Store    store.Store
	Cache    *cache.Cache
	// Near is the in-process near cache in front of Cache; the read path
	// goes through it (it passes every read to Cache when its TTL is 0).
	Near      *nearcache.Cache
	Telemetry *telemetry.Telemetry
	Tracing   *telemetry.Tracing
	Posts     *posts.Service
	// Follower follows the store's invalidation journal; nil when the
	// journal is disabled or the store keeps none.
	Follower *journal.Follower
	Guard    *guard.Server
	Admin    *admin.Server
	closers  []func() error
	tracer   trace.TracerProvider  // injected with WithTracerProvider
	cqlStats func() cqlstore.Stats // set when the store is the CQL one
	rawStore store.Store           // the backend, before any wrapping
}

// Option adjusts how New builds an App.
type Option func(*App)

// WithTracerProvider sends spans to tp instead of the pipeline the config
// describes (tests record spans in memory this way). The caller shuts tp
// down.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(a *App) { a.tracer = tp }
}

// WithStore serves records from st instead of opening the embedded store
// in Config.DataDir. The App takes ownership: Close closes st. Tests use
// it to put a failing or network store behind a real server.
func WithStore(st store.Store) Option {
	return func(a *App) { a.Store = st }
}

// New opens the store and builds every part; it listens on nothing yet.
// When log's handler is a *telemetry.LogHandler, its counters are
// exported as metrics.
func New(cfg Config, log *slog.Logger, opts ...Option) (*App, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.CQL.Log = log
	cfg.journalOrigin = newOrigin()
	a := &App{cfg: cfg, log: log}
	for _, opt := range opts {
		opt(a)
	}
	if err := a.build(); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

func (a *App) build() error {
	if a.Store == nil {
		openCtx, cancel := context.WithTimeout(context.Background(), storeOpenTimeout)
		defer cancel()
		st, err := OpenStore(openCtx, a.cfg)
		if err != nil {
			return err
		}
		a.Store = st
	}
	a.closers = append(a.closers, a.Store.Close)
	a.rawStore = a.Store
	if cql, ok := a.Store.(*cqlstore.Store); ok {
		a.cqlStats = cql.Stats
	}
	jr, _ := a.Store.(store.Journal)
	if a.cfg.Journal.Disabled {
		jr = nil
	}
	if a.cfg.StoreReadDelay > 0 {
		a.Store = delayedStore{Store: a.Store, delay: a.cfg.StoreReadDelay}
	}
	tp, err := a.tracerProvider()
	if err != nil {
		return err
	}
	cacheOpts := []cache.Option{cache.WithTracerProvider(tp), cache.WithLogger(a.log)}
	if jr != nil {
		cacheOpts = append(cacheOpts, cache.WithDistrust())
	}
	if a.Cache, err = cache.New(a.cfg.Cache, cacheOpts...); err != nil {
		return err
	}
	a.closers = append(a.closers, a.Cache.Close)
	if a.Near, err = nearcache.New(a.cfg.Near, a.Cache, nearcache.WithCheck(posts.CheckEntry)); err != nil {
		return err
	}
	a.closers = append(a.closers, a.Near.Close)
	if jr != nil {
		a.Follower = journal.New(a.followerConfig(jr), jr, followerCache{a.Cache, a.Near}, a.cfg.journalOrigin, journal.WithLogger(a.log))
	}
	if a.Telemetry, err = telemetry.New(a.cfg.Telemetry); err != nil {
		return err
	}
	a.closers = append(a.closers, func() error { return a.Telemetry.Shutdown(context.Background()) })
	requests, err := a.Telemetry.NewRequests(a.cfg.SLO)
	if err != nil {
		return err
	}
	if err := a.observe(); err != nil {
		return err
	}
	guardOpts, err := a.identityOptions()
	if err != nil {
		return err
	}
	guardOpts = append(guardOpts, guard.WithObserver(requests),
		guard.WithGRPCOptions(telemetry.ServerOptions(tp)...))
	if a.Guard, err = guard.New(a.cfg.guardConfig(), guardOpts...); err != nil {
		return err
	}
	if err := a.Telemetry.ObserveMemory(a.Guard.MemoryStats); err != nil {
		return err
	}
	instrumented, err := a.Telemetry.InstrumentStore(a.Store)
	if err != nil {
		return err
	}
	refused, err := a.Telemetry.RefusedValues()
	if err != nil {
		return err
	}
	a.postOpts = []posts.Option{posts.WithLogger(a.log), posts.WithRefusedValues(refused)}
	a.Posts = posts.New(aturi.PostCollection, a.Near, instrumented, posts.DefaultWriteLimits(),
		append(a.postOpts, posts.WithTracerProvider(tp), a.afterStoreWrite())...)
	writer, err := a.registerBsky(instrumented, requests)
	if err != nil {
		return err
	}
	if err := a.Guard.Register(&sluicev1.PostRecords_ServiceDesc, rpc.NewPostRecords(a.Posts, writer, requests).WithLimits(a.Guard)); err != nil {
		return err
	}
	a.Admin = admin.New(a.Telemetry.Handler())
	page := clientpage.New(a.Telemetry.Clients())
	a.Admin.Handle("GET /clients", page)
	a.Admin.Handle("GET /clients.json", page)
	a.Admin.Handle("GET /{$}", http.RedirectHandler("/clients", http.StatusFound))
	return nil
}

// tracerProvider returns the injected provider, or builds the pipeline
// the config describes (a no-op one without an OTLP endpoint).
func (a *App) tracerProvider() (trace.TracerProvider, error) {
	if a.tracer != nil {
		return a.tracer, nil
	}
	tr, err := telemetry.NewTracing(context.Background(), a.cfg.Telemetry)
	if err != nil {
		return nil, err
	}
	a.Tracing = tr
	a.closers = append(a.closers, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return tr.Shutdown(ctx)
	})
	return tr.Provider, nil
}

// observe registers the process, cache, socket, objective and log
// metrics.
func (a *App) observe() error {
	if err := a.Telemetry.ObserveCache(a.Cache.Stats); err != nil {
		return err
	}
	if err := a.Telemetry.ObserveCacheLimit(a.cfg.Cache.MaxConnsPerServer, a.cfg.Cache.Servers); err != nil {
		return err
	}
	if err := a.Telemetry.ObserveNearCache(a.Near.Stats); err != nil {
		return err
	}
	if err := a.Telemetry.ObserveSockets(a.cfg.Cache.Servers); err != nil {
		return err
	}
	if err := a.Telemetry.ObserveProcess(); err != nil {
		return err
	}
	if err := a.Telemetry.ObserveAdmission(a.admissionState); err != nil {
		return err
	}
	plan := a.cfg.MemoryPlan()
	if err := a.Telemetry.ObserveGoroutineBound(telemetry.GoroutineBound(plan.Streams, a.cfg.Guard.MaxInflightItems, plan.Connections)); err != nil {
		return err
	}
	if err := a.Telemetry.ObserveSLO(a.cfg.SLO); err != nil {
		return err
	}
	if a.cqlStats != nil {
		if err := a.Telemetry.ObserveCQL(a.cqlStats); err != nil {
			return err
		}
	}
	if a.Follower != nil {
		if err := a.Telemetry.ObserveJournal(a.Follower.Stats, a.journalSize, a.cfg.Journal.WithDefaults().MaxLag); err != nil {
			return err
		}
	}
	if lh, ok := a.log.Handler().(*telemetry.LogHandler); ok {
		return a.Telemetry.ObserveLogs(lh)
	}
	return nil
}

// registerBsky serves bsky.Service, the AppView's data-plane contract, and
// sluice.v1.Records, the write path of its collections, on the same
// guard, cache and store; posts share a.Posts with sluice.v1. It returns
// the records writer, through which sluice.v1.PostRecords writes too.
func (a *App) registerBsky(st store.Store, requests *telemetry.Requests) (*records.Writer, error) {
	services := map[string]*posts.Service{}
	for _, c := range bskyrpc.Collections() {
		services[c] = a.Posts
		if c != a.Posts.Collection() {
			services[c] = posts.New(c, a.Near, st, posts.DefaultWriteLimits(), a.postOpts...)
		}
	}
	threads := posts.New(opthread.Collection, a.Cache, st, posts.WriteLimits{MaxRecordBytes: records.MaxIndexBytes}, a.postOpts...)
	graph := posts.New(socialgraph.Collection, a.Cache, st, posts.DefaultWriteLimits(), a.postOpts...)
	svc := bskyrpc.New(func(collection string) *posts.Service {
		if collection == opthread.Collection {
			return threads
		}
		return services[collection]
	}, requests)
	if err := a.Guard.Register(&bsky.Service_ServiceDesc, svc); err != nil {
		return nil, err
	}
	w, err := records.New(services, threads, graph, records.WithHorizon(a.Near.Horizon()),
		records.WithVersioned(bskyrpc.DocumentCollection, bskyrpc.PublicationCollection))
	if err != nil {
		return nil, err
	}
	return w, a.Guard.Register(&sluicev1.Records_ServiceDesc, rpc.NewRecords(w))
}

// identityOptions turns on mutual TLS and certificate identities when
// the config asks for them.
func (a *App) identityOptions() ([]guard.Option, error) {
	if !a.cfg.TLS.Enabled() {
		return nil, nil
	}
	tlsCfg, err := a.cfg.TLS.ServerTLS()
	if err != nil {
		return nil, err
	}
	return []guard.Option{
		guard.WithGRPCOptions(grpc.Creds(credentials.NewTLS(tlsCfg))),
		guard.WithIdentity(identity.NewResolver(a.cfg.TLS).Resolve),
	}, nil
}

// Close releases the cache, store and telemetry, in reverse order of
// opening.
func (a *App) Close() error {
	var errs []error
	for i := len(a.closers) - 1; i >= 0; i-- {
		errs = append(errs, a.closers[i]())
	}
	a.closers = nil
	return errors.Join(errs...)
}

// Listen opens the gRPC and admin listeners from the config.
func (a *App) Listen() (grpcLis, httpLis net.Listener, err error) {
	if grpcLis, err = net.Listen("tcp", a.cfg.GRPCAddr); err != nil {
		return nil, nil, fmt.Errorf("listen gRPC on %s: %w", a.cfg.GRPCAddr, err)
	}
	if httpLis, err = net.Listen("tcp", a.cfg.HTTPAddr); err != nil {
		grpcLis.Close()
		return nil, nil, fmt.Errorf("listen admin HTTP on %s: %w", a.cfg.HTTPAddr, err)
	}
	return grpcLis, httpLis, nil
}

// Serve serves on the listeners until ctx ends, or one of its servers
// fails, then drains: readiness drops first, in-flight requests get
// DrainTimeout, new ones are refused.
func (a *App) Serve(ctx context.Context, grpcLis, httpLis net.Listener) error {
	ctx, failed := context.WithCancel(ctx)
	defer failed()
	a.log.Info("sluice serving", "grpc", grpcLis.Addr().String(), "admin", httpLis.Addr().String(),
		"memcached", a.cfg.Cache.Servers, "memcached_max_conns", a.cfg.Cache.MaxConnsPerServer,
		"store", a.cfg.storeName(), "tls", a.cfg.TLS.Enabled(), "note", a.trustNote(grpcLis.Addr()))
	if a.Follower != nil {
		a.catchUp(ctx)
	}
	// Lifecycle goroutines, each sending its result once: the gRPC and
	// admin servers, the drain watcher and, with a journal, its follower's
	// poll and tombstone-retry loops (which go on until the drain is
	// over). Serve returns the first error after all have ended.
	servers := 3
	followCtx, stopFollowing := context.WithCancel(context.Background())
	defer stopFollowing()
	done := make(chan error, 5)
	go func() { done <- a.Guard.Serve(grpcLis) }()
	go func() { done <- a.Admin.Serve(httpLis) }()
	if a.Follower != nil {
		servers += 2
		go func() {
			a.Follower.Run(followCtx)
			done <- nil
		}()
		go func() {
			a.Follower.RetryOwed(followCtx)
			done <- nil
		}()
	}
	a.Guard.SetServing(true)
	a.Admin.SetReady(true)
	go func() {
		<-ctx.Done()
		err := a.drain()
		stopFollowing()
		done <- err
	}()
	var err error
	for range servers {
		e := <-done
		if e != nil {
			failed() // drain the others rather than serve half-started
		}
		if err == nil {
			err = e
		}
	}
	a.log.Info("sluice stopped")
	return err
}

func (a *App) drain() error {
	a.log.Info("sluice draining", "timeout", a.cfg.DrainTimeout)
	a.Admin.SetReady(false)
	drainCtx, cancel := context.WithTimeout(context.Background(), a.cfg.DrainTimeout)
	defer cancel()
	a.Guard.Drain(drainCtx)
	shutdownCtx, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	return a.Admin.Shutdown(shutdownCtx)
}

func (a *App) trustNote(addr net.Addr) string {
	if a.cfg.TLS.Enabled() {
		return "mutual TLS: callers are named by their verified certificates"
	}
	return loopbackNote(addr)
}

func loopbackNote(addr net.Addr) string {
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsLoopback() {
		return "listening on loopback only; without TLS every caller's claimed name is trusted"
	}
	return "listening beyond loopback without TLS; callers' names are not authenticated"
}

// admissionState is the guard's admission as telemetry shows it.
func (a *App) admissionState() telemetry.AdmissionState {
	s := a.Guard.Admission()
	return telemetry.AdmissionState{
		ItemLimit: s.Capacity, MinItemLimit: s.MinItems, MaxItemLimit: s.MaxItems,
		ItemsInUse: s.InUse, Waiting: s.Waiting, Shed: s.Shed, Light: s.Light,
		RequestSlots: s.Slots.Capacity, SlotsInUse: s.Slots.InUse, SlotsWaiting: s.Slots.Waiting, SlotsShed: s.Slots.Shed,
	}
}

// followerCache is what the journal follower invalidates: memcached, and
// this replica's near cache, so that a change another replica made is
// forgotten here as soon as the follower reads it, not only when the near
// cache's TTL ends.
type followerCache struct {
	*cache.Cache
	near *nearcache.Cache
}

func (f followerCache) Invalidate(ctx context.Context, uris []string) error {
	return f.near.Invalidate(ctx, uris)
}

func (f followerCache) DropOn(ctx context.Context, addr string, uris []string) error {
	err := f.Cache.DropOn(ctx, addr, uris)
	f.near.Forget(uris)
	return err
}
