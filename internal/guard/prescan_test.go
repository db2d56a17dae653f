package guard_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard"
)

// decodedSizes is a unary interceptor, chained before the guard's, that
// notes how many URIs each GetPostRecords request held once decoded.
type decodedSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (d *decodedSizes) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if r, ok := req.(*sluicev1.GetPostRecordsRequest); ok {
		d.mu.Lock()
		d.sizes = append(d.sizes, len(r.GetUris()))
		d.mu.Unlock()
	}
	return h(ctx, req)
}

func (d *decodedSizes) seen() []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.sizes)
}

// itemsObserver records the item count of every rejected request.
type itemsObserver struct {
	observer
	mu    sync.Mutex
	items []int
}

func (o *itemsObserver) Rejected(ctx context.Context, r guard.Request, reason string) {
	o.mu.Lock()
	o.items = append(o.items, r.Items)
	o.mu.Unlock()
	o.observer.Rejected(ctx, r, reason)
}

// Tests that a batch over its method's limit is refused from a count of
// its wire bytes, without being decoded: the interceptor before the
// guard's sees an empty request, while the caller still gets the
// InvalidArgument naming the real count and the limit, and the observer
// (metrics) the real item count. A batch within the limit is decoded as
// usual and served.
func TestOversizedBatchNeverDecoded(t *testing.T) {
	sizes, obs := &decodedSizes{}, &itemsObserver{}
	f := start(t, testConfig(), newPostRecords(), guard.WithObserver(obs),
		guard.WithGRPCOptions(grpc.ChainUnaryInterceptor(sizes.intercept)))
	ctx := testContext(t, 10*time.Second)

	_, err := f.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris(20_000)})
	st := wantCode(t, err, codes.InvalidArgument)
	want := "GetPostRecords: 20000 uris exceeds the limit of 1000 per request; split the batch into requests of at most 1000"
	if st.Message() != want {
		t.Errorf("message = %q, want %q", st.Message(), want)
	}
	if fields := badRequestFields(st); !slices.Equal(fields, []string{"uris"}) {
		t.Errorf("BadRequest fields = %v, want [uris]", fields)
	}
	_, err = f.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris(1001)})
	wantCode(t, err, codes.InvalidArgument)
	resp, err := f.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris(1000)})
	if err != nil || len(resp.GetRecords()) != 1000 {
		t.Fatalf("1,000-URI batch: %d records, %v", len(resp.GetRecords()), err)
	}

	if got := sizes.seen(); !slices.Equal(got, []int{0, 0, 1000}) {
		t.Errorf("URIs decoded before the guard ran = %v, want [0 0 1000]: oversized batches must not be decoded", got)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if !slices.Equal(obs.items, []int{20_000, 1001}) {
		t.Errorf("rejected item counts = %v, want [20000 1001]", obs.items)
	}
	if got := obs.reasons(); !slices.Equal(got, []string{guard.ReasonShape, guard.ReasonShape}) {
		t.Errorf("rejection reasons = %v, want shape twice", got)
	}
	if n := f.impl.calls.Load(); n != 1 {
		t.Errorf("handler ran %d times, want once (the 1,000-URI batch)", n)
	}
}

// Tests that counting first keeps the other refusals: an empty batch is
// still refused by the shape check, and a request whose bytes are not a
// valid message gets InvalidArgument saying so, before the handler runs.
func TestCountFirstKeepsOtherChecks(t *testing.T) {
	f := start(t, testConfig(), newPostRecords())
	ctx := testContext(t, 10*time.Second)
	_, err := f.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{})
	if st := wantCode(t, err, codes.InvalidArgument); !strings.Contains(st.Message(), "has no uris") {
		t.Errorf("empty batch: %q", st.Message())
	}
	bad := grpc.ForceCodecV2(garbageCodec{})
	err = f.conn.Invoke(ctx, "/sluice.v1.PostRecords/GetPostRecords", &sluicev1.GetPostRecordsRequest{}, &sluicev1.GetPostRecordsResponse{}, bad)
	if st := wantCode(t, err, codes.InvalidArgument); !strings.Contains(st.Message(), "the request is not a valid sluice.v1.GetPostRecordsRequest") {
		t.Errorf("undecodable request: %q", st.Message())
	}
	if n := f.impl.calls.Load(); n != 0 {
		t.Errorf("handler ran %d times, want 0", n)
	}
}

// garbageCodec sends bytes that do not parse as any message: field 1
// announcing 127 bytes, followed by one.
type garbageCodec struct{}

func (garbageCodec) Name() string { return "proto" }

func (garbageCodec) Marshal(any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x7f, 'x'})}, nil
}

func (garbageCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return encoding.GetCodecV2("proto").Unmarshal(data, v)
}

// Tests that a batch whose bytes hold a group field, or stop parsing
// after many items, is refused with InvalidArgument saying so, before
// anything is decoded, whether it arrives in one frame or in many.
// Counting used to skip such a request (count 0), which then had every
// item before the fault decoded.
func TestUncountableBatchRefusedUndecoded(t *testing.T) {
	sizes := &decodedSizes{}
	f := start(t, testConfig(), newPostRecords(), guard.WithGRPCOptions(grpc.ChainUnaryInterceptor(sizes.intercept)))
	ctx := testContext(t, 10*time.Second)
	items := func(n int) []byte { // n times uris: ""
		return bytes.Repeat([]byte{0x0a, 0x00}, n)
	}
	group := []byte{0x9b, 0x06, 0x9c, 0x06} // field 99: start group, end group
	cases := []struct {
		name, want string
		body       []byte
	}{
		{"group, many frames", "field 99 is a group", append(slices.Clone(group), items(20_000)...)},
		{"group, one frame", "field 99 is a group", append(items(10), group...)},
		{"bad tail, many frames", "do not parse as protobuf from byte 40000", append(items(20_000), 0x0a, 0x7f)},
		{"bad tail, one frame", "do not parse as protobuf from byte 20", append(items(10), 0x0a, 0x7f)},
	}
	for _, c := range cases {
		err := f.conn.Invoke(ctx, "/sluice.v1.PostRecords/GetPostRecords", &c.body, new([]byte), grpc.ForceCodecV2(rawBytesCodec{}))
		if st := wantCode(t, err, codes.InvalidArgument); !strings.Contains(st.Message(), c.want) {
			t.Errorf("%s: message %q, want it to say %q", c.name, st.Message(), c.want)
		}
	}
	if got := sizes.seen(); len(got) != 0 {
		t.Errorf("requests decoded = %v, want none", got)
	}
	if n := f.impl.calls.Load(); n != 0 {
		t.Errorf("handler ran %d times, want 0", n)
	}
}

// rawBytesCodec sends a *[]byte as the request's wire bytes.
type rawBytesCodec struct{}

func (rawBytesCodec) Name() string { return "proto" }

func (rawBytesCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawBytesCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
