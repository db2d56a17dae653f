package naive

import (
	"context"
	"io"
	"log"
	"net"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/boltstore"
	"github.com/sluice-dev/sluice/internal/synth"
	"github.com/sluice-dev/sluice/internal/testenv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Tests that the baseline answers the sluice.v1 API correctly through
// the guard's registration path, accepts a 5,000-URI batch sluice would
// refuse, serves a repeat from memcached, and exports its dials under
// sluice's metric names.
func TestBaselineServesBigBatches(t *testing.T) {
	mc := testenv.StartMemcached(t)
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gen := synth.New(1, 50)
	var recs []store.Record
	var uris []string
	for range 5000 {
		r := gen.Next()
		recs = append(recs, r)
		uris = append(uris, r.URI)
	}
	if err := st.Put(ctx, recs); err != nil {
		t.Fatal(err)
	}
	missing := gen.MissingURI()
	uris = append(uris[:4999], missing)

	svc := New(mc.Addr(), st, log.New(io.Discard, "", 0))
	srv, err := NewServer(svc)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() {
		srv.Drain(ctx)
		<-served
	}()
	srv.SetServing(true)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := sluicev1.NewPostRecordsClient(conn)
	for round := range 2 {
		resp, err := client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if len(resp.Records) != len(uris) {
			t.Fatalf("round %d: %d records for %d URIs", round, len(resp.Records), len(uris))
		}
		for i, r := range resp.Records[:4999] {
			if !r.GetFound() || r.GetUri() != uris[i] || string(r.GetRecord()) != string(recs[i].JSON) {
				t.Fatalf("round %d: record %d = %v, want %s", round, i, r.GetUri(), uris[i])
			}
		}
		if resp.Records[4999].GetFound() {
			t.Errorf("round %d: missing URI reported found", round)
		}
	}
	if svc.dials.Load() < 2 {
		t.Errorf("%d dials; one goroutine per URI should need many connections", svc.dials.Load())
	}
	rec := httptest.NewRecorder()
	svc.Metrics().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, name := range []string{"sluice_memcached_dials_total", "sluice_memcached_connections_open", "sluice_cache_errors_total", "go_goroutines", "go_threads"} {
		if !strings.Contains(rec.Body.String(), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}
