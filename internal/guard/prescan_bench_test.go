package guard

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
)

// BenchmarkRefuseOversizedBatch measures what refusing one 20,000-URI
// GetPostRecords request costs the server: counting its items from the
// wire bytes (what the guard does) against decoding it first and then
// checking its shape (what a server that checks after decoding pays), in
// the same run, taking turns. It reports both costs per request, the
// bytes each allocates, and the ratios.
func BenchmarkRefuseOversizedBatch(b *testing.B) {
	uris := make([]string, 20_000)
	for i := range uris {
		uris[i] = fmt.Sprintf("at://did:plc:%024d/app.bsky.feed.post/3k%011d", i, i)
	}
	wire, err := proto.Marshal(&sluicev1.GetPostRecordsRequest{Uris: uris})
	if err != nil {
		b.Fatal(err)
	}
	f := findItemField((&sluicev1.GetPostRecordsRequest{}).ProtoReflect().Descriptor())
	p := DefaultPolicy()

	decodeFirst := func() error {
		var req sluicev1.GetPostRecordsRequest
		if err := proto.Unmarshal(wire, &req); err != nil {
			return err
		}
		return checkShape("GetPostRecords", f, f.items(&req), p)
	}
	countFirst := func() error {
		n, err := f.count(wire)
		if err != nil {
			return err
		}
		return tooManyItems("GetPostRecords", f, n, p)
	}
	var took [2]time.Duration
	var allocated [2]uint64
	b.ResetTimer()
	for i := range b.N {
		for turn := range 2 {
			which := (i + turn) % 2 // 0: count first, 1: decode first
			run := []func() error{countFirst, decodeFirst}[which]
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			if err := run(); err == nil {
				b.Fatal("a 20,000-URI batch was not refused")
			}
			took[which] += time.Since(start)
			runtime.ReadMemStats(&after)
			allocated[which] += after.TotalAlloc - before.TotalAlloc
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(took[0].Microseconds())/n, "count-µs/req")
	b.ReportMetric(float64(took[1].Microseconds())/n, "decode-µs/req")
	b.ReportMetric(float64(allocated[0])/n, "count-B/req")
	b.ReportMetric(float64(allocated[1])/n, "decode-B/req")
	b.ReportMetric(took[1].Seconds()/took[0].Seconds(), "decode/count-time")
	b.ReportMetric(float64(allocated[1])/max(float64(allocated[0]), 1), "decode/count-bytes")
}
