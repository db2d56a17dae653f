// Package naive is the benchmarks' baseline: a server of the same
// sluice.v1.PostRecords API written the way the April 2026 outage's
// endpoint was. Each GetPostRecords call starts one goroutine per URI with
// a bare go statement; each goroutine reads memcached through one plain
// gomemcache client whose idle pool holds 1,000 connections and whose
// number of open connections has no cap; a miss or an error reads the
// store and sets the cache; and every cache error is written to the log.
//
// It exists only so that `make bench` can show the two designs on the
// same machine in the same run. Nothing in cmd/sluice or internal/
// imports it, so `sluice serve` can never serve it. It borrows sluice's
// registration path (guard.New and Register, the only way the structure
// test allows a service to be registered) with a policy so permissive —
// 100,000 URIs, a concurrency of 100,000, a one-minute timeout and a
// process-wide item budget of a billion — that the guard limits nothing;
// the unbounded fan-out is the handler's own.
//
// It exports the same metric names as sluice for what it shares
// (sluice_memcached_dials_total, sluice_memcached_connections_open,
// sluice_cache_errors_total, go_goroutines, go_threads,
// process_resident_memory_bytes), so the load harness samples both alike.
package naive

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/posts"
	"github.com/sluice-dev/sluice/internal/rpc"
	"github.com/sluice-dev/sluice/internal/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// MaxIdleConns is the idle pool of the outage's memcached client.
const MaxIdleConns = 1000

// Service answers sluice.v1.PostRecords the naive way.
type Service struct {
	sluicev1.UnimplementedPostRecordsServer
	mc    *memcache.Client
	store store.Store
	log   *log.Logger
	addr  string

	dials, open, cacheErrors atomic.Int64
}

// New returns a Service reading memcached at addr (one server) and st,
// logging every cache error to logger.
func New(addr string, st store.Store, logger *log.Logger) *Service {
	s := &Service{store: st, log: logger, addr: addr}
	s.mc = memcache.New(addr)
	s.mc.MaxIdleConns = MaxIdleConns
	s.mc.DialContext = s.dial
	return s
}

// dial counts every connection made and every one closed.
func (s *Service) dial(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	s.dials.Add(1)
	s.open.Add(1)
	return &countedConn{Conn: c, open: &s.open}, nil
}

type countedConn struct {
	net.Conn
	open   *atomic.Int64
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
}

// GetPostRecords starts one goroutine per URI, as the outage's endpoint did.
func (s *Service) GetPostRecords(ctx context.Context, req *sluicev1.GetPostRecordsRequest) (*sluicev1.GetPostRecordsResponse, error) {
	uris := req.GetUris()
	out := make([]*sluicev1.PostRecord, len(uris))
	errs := make([]error, len(uris))
	var wg sync.WaitGroup
	for i, uri := range uris {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = s.get(ctx, uri)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, status.Errorf(codes.Unavailable, "GetPostRecords: %v", err)
	}
	return &sluicev1.GetPostRecordsResponse{Records: out}, nil
}

// GetPostRecord answers one URI.
func (s *Service) GetPostRecord(ctx context.Context, req *sluicev1.GetPostRecordRequest) (*sluicev1.PostRecord, error) {
	r, err := s.get(ctx, req.GetUri())
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "GetPostRecord: %v", err)
	}
	return r, nil
}

// get reads one URI: memcached, then the store on a miss or an error,
// then sets the cache. Every cache error is logged.
func (s *Service) get(ctx context.Context, uri string) (*sluicev1.PostRecord, error) {
	key := cache.Key(uri)
	it, err := s.mc.Get(key)
	if err == nil {
		var pr sluicev1.PostRecord
		if proto.Unmarshal(it.Value, &pr) == nil {
			return &pr, nil
		}
	} else if !errors.Is(err, memcache.ErrCacheMiss) {
		s.cacheErrors.Add(1)
		s.log.Printf("failed to get post cache item %s: %v", uri, err)
	}
	rec, err := s.store.Get(ctx, uri)
	if errors.Is(err, store.ErrNotFound) {
		return &sluicev1.PostRecord{Uri: uri}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", uri, err)
	}
	pr := posts.ToProto(rec, true)
	if b, err := proto.Marshal(pr); err == nil {
		if err := s.mc.Set(&memcache.Item{Key: key, Value: b, Expiration: 600}); err != nil {
			s.cacheErrors.Add(1)
			s.log.Printf("failed to set post cache item %s: %v", uri, err)
		}
	}
	return pr, nil
}

// Metrics returns a /metrics handler with the Go runtime and process
// collectors and the memcached figures under sluice's names.
func (s *Service) Metrics() http.Handler {
	reg := prometheus.NewRegistry()
	server := prometheus.Labels{"server": s.addr}
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_memcached_dials_total", Help: "Connections dialed to memcached.", ConstLabels: server},
			func() float64 { return float64(s.dials.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_memcached_connections_open", Help: "Connections to memcached not yet closed.", ConstLabels: server},
			func() float64 { return float64(s.open.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_cache_errors_total", Help: "memcached calls that failed (each one logged).", ConstLabels: server},
			func() float64 { return float64(s.cacheErrors.Load()) }),
	)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

// PermissiveConfig is a guard configuration that limits nothing a
// benchmark sends: the naive server borrows only the registration path.
func PermissiveConfig() guard.Config {
	cfg := guard.DefaultConfig()
	cfg.MaxInflightItems = 1_000_000_000
	cfg.MaxInflightRequests = 1_000_000
	// No per-client budget either: the outage's endpoint had none.
	cfg.Admission.Default = budget.Budget{ItemsPerSecond: 1e12, Burst: 1_000_000_000, MaxInflightItems: 1_000_000_000}
	cfg.MaxRecvMsgBytes = 256 << 20
	// Nor a memory budget: a limit no allocation reaches, so every
	// request's reservation fits.
	cfg.MemoryLimit = 1 << 50 // the most the guard accepts
	for name := range rpc.DefaultPolicies() {
		cfg.Methods[name] = guard.Policy{MaxItems: 100_000, MaxURILength: 8192, Concurrency: 100_000, Timeout: time.Minute}
	}
	return cfg
}

// NewServer returns a guard.Server serving svc under PermissiveConfig.
func NewServer(svc *Service) (*guard.Server, error) {
	g, err := guard.New(PermissiveConfig())
	if err != nil {
		return nil, fmt.Errorf("naive: %w", err)
	}
	if err := g.Register(&sluicev1.PostRecords_ServiceDesc, svc); err != nil {
		return nil, fmt.Errorf("naive: %w", err)
	}
	return g, nil
}
