//go:build cluster

package cluster

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/synth"
)

// op is one finished call of the load.
type op struct {
	write      bool
	start, end time.Time
	code       codes.Code
	msg        string
}

// load is steady traffic from named callers: readers of random seeded
// posts (batches of readBatch) and writers of new posts, one call at a
// time each, paced by a short pause. Every call is recorded; every
// acknowledged write is kept, to be read back later.
type load struct {
	ops   []op
	mu    sync.Mutex
	acked map[string]string // uri -> cid of every acknowledged write

	stop chan struct{}
	wg   sync.WaitGroup
	seq  atomic.Uint64
}

const (
	readers   = 4
	writers   = 2
	readBatch = 10
	pause     = 10 * time.Millisecond
	callLimit = 6 * time.Second // each call's deadline, above the methods' 5 s timeout
)

// startLoad runs readers and writers against the clients round-robin
// (one replica's client, or several) until stop.
func startLoad(t *testing.T, uris []string, clients ...sluicev1.PostRecordsClient) *load {
	t.Helper()
	l := &load{acked: map[string]string{}, stop: make(chan struct{})}
	for i := range readers {
		l.wg.Add(1)
		go l.reader(uint64(i), uris, clients)
	}
	for i := range writers {
		l.wg.Add(1)
		go l.writer(uint64(i), clients)
	}
	t.Cleanup(l.halt)
	return l
}

func ctxAs(name string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), callLimit)
	return metadata.AppendToOutgoingContext(ctx, "x-client-id", name), cancel
}

func (l *load) reader(seed uint64, uris []string, clients []sluicev1.PostRecordsClient) {
	defer l.wg.Done()
	rng := rand.New(rand.NewPCG(seed, 7))
	for n := 0; ; n++ {
		select {
		case <-l.stop:
			return
		case <-time.After(pause):
		}
		batch := make([]string, readBatch)
		for i := range batch {
			batch[i] = uris[rng.IntN(len(uris))]
		}
		ctx, cancel := ctxAs("feed")
		start := time.Now()
		resp, err := clients[n%len(clients)].GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: batch})
		cancel()
		if err == nil {
			for i, r := range resp.GetRecords() {
				if !r.GetFound() {
					err = status.Errorf(codes.DataLoss, "seeded post %s answered not found", batch[i])
					break
				}
			}
		}
		l.record(op{start: start, end: time.Now(), code: status.Code(err), msg: errMsg(err)})
	}
}

func (l *load) writer(seed uint64, clients []sluicev1.PostRecordsClient) {
	defer l.wg.Done()
	gen := synth.New(1000+seed, 50)
	for n := 0; ; n++ {
		select {
		case <-l.stop:
			return
		case <-time.After(pause):
		}
		rec := gen.Next()
		ctx, cancel := ctxAs("writer")
		start := time.Now()
		_, err := clients[n%len(clients)].PutPostRecords(ctx, &sluicev1.PutPostRecordsRequest{Records: []*sluicev1.PostRecord{{
			Uri: rec.URI, Cid: rec.CID, Record: rec.JSON,
		}}})
		cancel()
		l.record(op{write: true, start: start, end: time.Now(), code: status.Code(err), msg: errMsg(err)})
		if err == nil {
			l.mu.Lock()
			l.acked[rec.URI] = rec.CID
			l.mu.Unlock()
		}
	}
}

func errMsg(err error) string {
	if err == nil {
		return ""
	}
	return status.Convert(err).Message()
}

func (l *load) record(o op) {
	l.mu.Lock()
	l.ops = append(l.ops, o)
	l.mu.Unlock()
}

// halt stops the load and waits for every call in flight.
func (l *load) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// tally counts the calls that started in [from, to).
type tally struct {
	reads, writes, readErrs, writeErrs int
	codes                              map[codes.Code]int
	firstErr                           string // the first failed call's code and message
	firstReadErr, firstWriteErr        string // the same, of reads and of writes
	slowestWriteErr                    time.Duration
	errAt                              []time.Duration // when each failed call started, after from
}

func (l *load) between(from, to time.Time) tally {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := tally{codes: map[codes.Code]int{}}
	for _, o := range l.ops {
		if o.start.Before(from) || !o.start.Before(to) {
			continue
		}
		if o.write {
			t.writes++
		} else {
			t.reads++
		}
		if o.code == codes.OK {
			continue
		}
		t.codes[o.code]++
		t.errAt = append(t.errAt, o.start.Sub(from).Round(100*time.Millisecond))
		if t.firstErr == "" {
			t.firstErr = fmt.Sprintf("%v: %s", o.code, o.msg)
		}
		if o.write {
			t.writeErrs++
			t.slowestWriteErr = max(t.slowestWriteErr, o.end.Sub(o.start))
			t.firstWriteErr = cmp.Or(t.firstWriteErr, fmt.Sprintf("%v: %s", o.code, o.msg))
		} else {
			t.readErrs++
			t.firstReadErr = cmp.Or(t.firstReadErr, fmt.Sprintf("%v: %s", o.code, o.msg))
		}
	}
	return t
}

func (t tally) String() string {
	s := fmt.Sprintf("%d reads (%d failed), %d writes (%d failed)", t.reads, t.readErrs, t.writes, t.writeErrs)
	if len(t.codes) > 0 {
		s += fmt.Sprintf(", codes %v, failed calls started at %v after the window opened", t.codes, t.errAt[:min(len(t.errAt), 10)])
	}
	return s
}

// ackedWrites returns a copy of every acknowledged write.
func (l *load) ackedWrites() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]string, len(l.acked))
	for k, v := range l.acked {
		out[k] = v
	}
	return out
}
