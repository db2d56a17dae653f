package guard

import (
	"fmt"
	"strings"
	"testing"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"google.golang.org/protobuf/proto"
)

// piecesOf encodes records as a joined answer's parts of size records
// each, as pieces() and serveSplit do.
func piecesOf(t *testing.T, records []*sluicev1.PostRecord, size int) [][]byte {
	t.Helper()
	var parts [][]byte
	for lo := 0; lo < len(records); lo += size {
		hi := min(len(records), lo+size)
		b, err := proto.Marshal(&sluicev1.GetPostRecordsResponse{Records: records[lo:hi]})
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, b)
	}
	return parts
}

// Tests that a joined answer goes to the transport as its pieces' own
// bytes, in order, without being copied into one buffer, that it decodes
// as the whole answer, and that its reservation in the response ledger
// is held until the transport has freed every part, then given back
// whole.
func TestJoinedAnswerGoesOutUncopiedAndReleasesOnLastFree(t *testing.T) {
	records := make([]*sluicev1.PostRecord, 25)
	for i := range records {
		records[i] = &sluicev1.PostRecord{Uri: fmt.Sprintf("at://did:plc:a/app.bsky.feed.post/%d", i), Found: true,
			Record: []byte(strings.Repeat("x", 400))}
	}
	parts := piecesOf(t, records, 10) // 10, 10 and 5 records, each part over the pooling threshold
	first := &parts[0][0]
	joined := joinWire(parts)

	ledger := membudget.NewLedger("response bytes", 1<<30, 1<<30)
	res, refusal := ledger.Reserve("indexer", membudget.Bytes(joined.size))
	if refusal != nil {
		t.Fatal(refusal)
	}
	bufs, err := codec{}.Marshal(&sizedResponse{parts: joined.parts, size: joined.size, res: res})
	if err != nil {
		t.Fatal(err)
	}
	if len(bufs) != 3 || &bufs[0].ReadOnlyData()[0] != first {
		t.Fatalf("%d buffers, first at %p; want the 3 parts themselves, the first at %p", len(bufs), &bufs[0].ReadOnlyData()[0], first)
	}

	var got sluicev1.GetPostRecordsResponse
	if err := proto.Unmarshal(bufs.Materialize(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Records) != len(records) {
		t.Fatalf("decoded %d records, want %d", len(got.Records), len(records))
	}
	for i, r := range got.Records {
		if !proto.Equal(r, records[i]) {
			t.Fatalf("record %d is %s, want %s", i, r.GetUri(), records[i].GetUri())
		}
	}

	whole := membudget.Bytes(joined.size)
	for i, b := range bufs {
		if held := ledger.Stats().Held; held != whole {
			t.Fatalf("before part %d was freed the ledger holds %v, want the answer's %v", i, held, whole)
		}
		b.Free()
	}
	if held := ledger.Stats().Held; held != 0 {
		t.Fatalf("after every part was freed the ledger holds %v, want 0", held)
	}
}

// Tests that an answer of parts too small to be tracked by the transport
// gives its reservation back at once.
func TestJoinedAnswerOfSmallPartsReleasesAtOnce(t *testing.T) {
	records := []*sluicev1.PostRecord{{Uri: "at://did:plc:a/app.bsky.feed.post/1"}, {Uri: "at://did:plc:a/app.bsky.feed.post/2"}}
	joined := joinWire(piecesOf(t, records, 1))
	ledger := membudget.NewLedger("response bytes", 1<<20, 1<<20)
	res, _ := ledger.Reserve("indexer", membudget.Bytes(joined.size))
	if _, err := (codec{}).Marshal(&sizedResponse{parts: joined.parts, size: joined.size, res: res}); err != nil {
		t.Fatal(err)
	}
	if held := ledger.Stats().Held; held != 0 {
		t.Fatalf("the ledger holds %v after small parts were handed over, want 0", held)
	}
}

// Tests that an answer whose last part is too small to be tracked waits
// for its tracked parts only: the reservation stays while one is held
// and goes back when the last tracked part is freed.
func TestJoinedAnswerWaitsForTrackedPartsOnly(t *testing.T) {
	records := make([]*sluicev1.PostRecord, 20)
	for i := range records {
		records[i] = &sluicev1.PostRecord{Uri: fmt.Sprintf("at://did:plc:a/app.bsky.feed.post/%d", i), Record: []byte(strings.Repeat("x", 400))}
	}
	parts := append(piecesOf(t, records, 10), piecesOf(t, []*sluicev1.PostRecord{{Uri: "at://did:plc:a/app.bsky.feed.post/small"}}, 1)...)
	joined := joinWire(parts)
	ledger := membudget.NewLedger("response bytes", 1<<30, 1<<30)
	res, _ := ledger.Reserve("indexer", membudget.Bytes(joined.size))
	bufs, err := codec{}.Marshal(&sizedResponse{parts: joined.parts, size: joined.size, res: res})
	if err != nil {
		t.Fatal(err)
	}
	bufs[0].Free()
	bufs[2].Free() // the small part
	if held := ledger.Stats().Held; held != membudget.Bytes(joined.size) {
		t.Fatalf("the ledger holds %v with a tracked part still held, want the answer's %v", held, joined.size)
	}
	bufs[1].Free()
	if held := ledger.Stats().Held; held != 0 {
		t.Fatalf("the ledger holds %v after every tracked part was freed, want 0", held)
	}
}

// Tests a connection's held answers: ending the connection gives back
// what it held, an answer held after the end goes back at once (the
// transport refuses to queue it), and the frees that come later change
// nothing.
func TestConnAnswersGiveBackOnEnd(t *testing.T) {
	ledger := membudget.NewLedger("response bytes", 1<<20, 1<<20)
	conn := &connAnswers{held: map[*membudget.Reservation]struct{}{}}
	queued, _ := ledger.Reserve("feed", 1000)
	conn.hold(queued)
	if held := ledger.Stats().Held; held != 1000 {
		t.Fatalf("the ledger holds %v with one answer queued, want 1000B", held)
	}
	conn.end()
	if held := ledger.Stats().Held; held != 0 {
		t.Fatalf("the ledger holds %v after the connection ended, want 0", held)
	}
	late, _ := ledger.Reserve("feed", 1000)
	conn.hold(late)
	if held := ledger.Stats().Held; held != 0 {
		t.Fatalf("the ledger holds %v after an answer was held on an ended connection, want 0", held)
	}
	conn.release(queued)
	conn.release(late)
	if held := ledger.Stats().Held; held != 0 {
		t.Fatalf("the ledger holds %v after the late frees, want 0", held)
	}
}
