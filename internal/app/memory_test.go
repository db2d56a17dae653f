package app

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/telemetry"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Tests that the memory budget's caps leave ordinary batches alone at
// their defaults: a legal 1,000-URI batch is served, and a 20,000-URI
// batch of ordinary URIs (about 1.5 MB, the outage's own request) still
// reaches the count and gets the InvalidArgument that names the limit —
// the bytes bound comes from accounting, not from a smaller
// max_recv_msg_bytes. /metrics and /clients.json show the budget, the
// heap, bytes in flight, streams and connections.
func TestOrdinaryBatchesAtDefaultMemoryCaps(t *testing.T) {
	ts := startServer(t, 1000, nil)
	uris := make([]string, 1000)
	for i := range uris {
		uris[i] = ts.posts[i].URI
	}
	resp, err := ts.client.GetPostRecords(ts.ctx("legal"), &sluicev1.GetPostRecordsRequest{Uris: uris})
	if err != nil || len(resp.GetRecords()) != 1000 {
		t.Fatalf("1,000-URI batch: %d records, %v; want all 1,000", len(resp.GetRecords()), err)
	}

	big := make([]string, 20_000)
	for i := range big {
		big[i] = ts.posts[i%len(ts.posts)].URI
	}
	_, err = ts.client.GetPostRecords(ts.ctx("outage"), &sluicev1.GetPostRecordsRequest{Uris: big})
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "20000 uris exceeds the limit of 1000") {
		t.Errorf("20,000 ordinary URIs: %v %q, want InvalidArgument naming the limit", st.Code(), st.Message())
	}

	plan := ts.app.Guard.MemoryStats().Plan
	m := ts.metrics()
	for name, want := range map[string]float64{
		"sluice_memory_limit_bytes":          float64(plan.Limit),
		"sluice_request_bytes_max_in_flight": float64(plan.Requests),
		"sluice_request_bytes_in_flight":     0,
		"sluice_response_bytes_in_flight":    0,
		"sluice_grpc_connections_max":        float64(plan.Connections),
		"sluice_grpc_streams_max":            float64(plan.Streams),
	} {
		if got := m.Sum(name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := m.Sum("sluice_grpc_connections_open", nil); got < 1 {
		t.Errorf("sluice_grpc_connections_open = %v with the test's connection open", got)
	}
	if got := m.Sum("sluice_memory_heap_bytes", nil); got <= 0 || got > float64(plan.Limit) {
		t.Errorf("sluice_memory_heap_bytes = %v", got)
	}
	if got := m.Sum("sluice_request_bytes_peak", nil); got < float64(plan.LargestStream)-float64(16<<20) {
		t.Errorf("sluice_request_bytes_peak = %v, want at least one stream's reservation", got)
	}

	res, err := http.Get(ts.adminURL + "/clients.json")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var snap telemetry.ClientsSnapshot
	if err := json.NewDecoder(res.Body).Decode(&snap); err != nil {
		t.Fatal(err)
	}
	if snap.Memory == nil || snap.Memory.LimitBytes != int64(plan.Limit) || snap.Memory.MaxConnections != int64(plan.Connections) || snap.Memory.HeapBytes <= 0 {
		t.Errorf("/clients.json memory = %+v, want the plan's figures and the heap", snap.Memory)
	}
}
