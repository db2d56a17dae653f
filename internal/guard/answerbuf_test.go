package guard

import (
	"context"
	"testing"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// answerOf builds a GetPostRecordsResponse of n records the way package
// rpc does: written into AnswerBuffer, carried as unknown fields.
func answerOf(ctx context.Context, n int) (*sluicev1.GetPostRecordsResponse, []byte) {
	record, _ := proto.Marshal(&sluicev1.PostRecord{Uri: "at://did:plc:a/app.bsky.feed.post/1", Found: true, Record: make([]byte, 400)})
	buf := AnswerBuffer(ctx, n*(len(record)+3))
	for range n {
		buf = protowire.AppendTag(buf, 1, protowire.BytesType)
		buf = protowire.AppendBytes(buf, record)
	}
	resp := &sluicev1.GetPostRecordsResponse{}
	resp.ProtoReflect().SetUnknown(buf)
	return resp, buf
}

// Tests that an answer written into the call's pooled buffer goes to the
// transport as that buffer, uncopied, decodes as the records written,
// holds its reservation until the transport frees it, and goes back to
// the pool then; and that only the first buffer of a call is pooled.
func TestAnswerBufferGoesOutAsItIsAndBackToThePool(t *testing.T) {
	ctx, slot := withAnswerSlot(context.Background())
	resp, buf := answerOf(ctx, 50)
	if slot.buf == nil || &(*slot.buf)[:1][0] != &buf[:1][0] {
		t.Fatal("the call's first answer buffer is not the pooled one")
	}
	if second := AnswerBuffer(ctx, len(buf)); slot.buf != nil && &second[:1][0] == &(*slot.buf)[:1][0] {
		t.Fatal("a second answer buffer of the same call is the pooled one")
	}

	s := &Server{mem: &memory{responses: membudget.NewLedger("response bytes", 1<<30, 1<<30)}}
	out, err := s.holdResponse(ctx, getPostRecords, "feed", resp, nil)
	if err != nil {
		t.Fatal(err)
	}
	sized := out.(*sizedResponse)
	if sized.recycle != slot.buf || sized.size != len(buf) {
		t.Fatalf("held answer recycles %p, size %d; want the pooled buffer %p, size %d", sized.recycle, sized.size, slot.buf, len(buf))
	}
	bufs, err := codec{}.Marshal(sized)
	if err != nil {
		t.Fatal(err)
	}
	if len(bufs) != 1 || &bufs[0].ReadOnlyData()[0] != &buf[0] {
		t.Fatalf("%d buffers handed to the transport; want the answer buffer itself", len(bufs))
	}
	var got sluicev1.GetPostRecordsResponse
	if err := proto.Unmarshal(bufs.Materialize(), &got); err != nil || len(got.Records) != 50 {
		t.Fatalf("the answer decodes as %d records (%v), want 50", len(got.Records), err)
	}
	if held := s.mem.responses.Stats().Held; held != membudget.Bytes(len(buf)) {
		t.Fatalf("before the transport freed it the ledger holds %v, want %d", held, len(buf))
	}
	bufs.Free()
	if held := s.mem.responses.Stats().Held; held != 0 {
		t.Fatalf("after the transport freed it the ledger holds %v, want 0", held)
	}
	// The pool may drop what it is given (a quarter of the time under
	// the race detector), so the next calls answer until one is given
	// the buffer the call before it wrote.
	last := &buf[0]
	for range 20 {
		ctx, _ := withAnswerSlot(context.Background())
		resp, buf := answerOf(ctx, 50)
		if &buf[0] == last {
			return
		}
		out, err := s.holdResponse(ctx, getPostRecords, "feed", resp, nil)
		if err != nil {
			t.Fatal(err)
		}
		bufs, err := codec{}.Marshal(out.(*sizedResponse))
		if err != nil {
			t.Fatal(err)
		}
		bufs.Free()
		last = &buf[0]
	}
	t.Fatal("no call was given the answer buffer the call before it wrote")
}

// Tests that an answer that is not its pooled buffer's bytes as they are
// is not recycled: one grown past the buffer, one that does not start at
// it, one with a known field set, and one outside a guarded call.
func TestAnswerBufferIsRecycledOnlyWhenAnsweredAsItIs(t *testing.T) {
	s := &Server{mem: &memory{responses: membudget.NewLedger("response bytes", 1<<30, 1<<30)}}
	hold := func(ctx context.Context, resp *sluicev1.GetPostRecordsResponse) *sizedResponse {
		t.Helper()
		out, err := s.holdResponse(ctx, getPostRecords, "feed", resp, nil)
		if err != nil {
			t.Fatal(err)
		}
		return out.(*sizedResponse)
	}

	ctx, _ := withAnswerSlot(context.Background())
	resp, buf := answerOf(ctx, 10)
	grown := append(buf, make([]byte, cap(buf))...)
	resp.ProtoReflect().SetUnknown(grown)
	if r := hold(ctx, resp); r.recycle != nil {
		t.Error("an answer grown past its buffer is recycled")
	}

	ctx, _ = withAnswerSlot(context.Background())
	resp, buf = answerOf(ctx, 10)
	resp.ProtoReflect().SetUnknown(buf[1:])
	if r := hold(ctx, resp); r.recycle != nil {
		t.Error("an answer not starting at its buffer is recycled")
	}

	ctx, _ = withAnswerSlot(context.Background())
	resp, _ = answerOf(ctx, 10)
	resp.Records = []*sluicev1.PostRecord{{Uri: "at://did:plc:a/app.bsky.feed.post/2"}}
	if r := hold(ctx, resp); r.recycle != nil || r.msg == nil {
		t.Error("an answer with a known field set is not marshalled")
	}

	resp, _ = answerOf(context.Background(), 10)
	if r := hold(context.Background(), resp); r.recycle != nil || r.parts == nil {
		t.Error("an answer outside a guarded call is recycled, or not carried verbatim")
	}
}
