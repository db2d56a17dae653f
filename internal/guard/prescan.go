package guard

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// A batch request's items are counted from its wire bytes before the
// request is decoded. A batch over its method's limit is then refused at
// the cost of one pass over its bytes, instead of first allocating every
// URI it carries: a 20,000-URI request is 20,000 strings and about 1.5 MB
// of garbage, decoded only to be thrown away, and each such decode is a
// few milliseconds of a core that well-behaved callers were waiting for.
//
// The server decodes every request through codec. For a guarded batch
// method, the handler Register installs asks it for the raw bytes
// (rawRequest), counts the item field, and then either decodes them or,
// if there are too many items, leaves the request empty and tells the
// interceptor the count (withCounted), which refuses it exactly as if it
// had decoded it: same status, same message, same metrics.

// codec is gRPC's protobuf codec, except that it hands a rawRequest the
// message's bytes undecoded, and writes a sizedResponse into buffers that
// give its reserved bytes back when freed (response.go).
type codec struct{ proto encoding.CodecV2 }

func newCodec() (codec, error) {
	c := encoding.GetCodecV2("proto")
	if c == nil {
		return codec{}, errors.New("guard: gRPC has no proto codec registered")
	}
	return codec{proto: c}, nil
}

func (c codec) Name() string { return c.proto.Name() }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*sizedResponse); ok {
		return marshalSized(r)
	}
	return c.proto.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*rawRequest); ok {
		data.Ref()
		r.data = data
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// rawRequest receives a request's bytes from codec, as the transport
// read them (frames of up to 16 KiB): counting reads them in place, and
// only a request that will be decoded is copied into one buffer.
type rawRequest struct{ data mem.BufferSlice }

// free returns the bytes to the pool; later calls do nothing.
func (r *rawRequest) free() {
	r.data.Free()
	r.data = nil
}

// countedKey marks a request refused by count without being decoded.
type countedKey struct{}

// withCounted records that the request carries n items, more than its
// method allows, and was left undecoded.
func withCounted(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, countedKey{}, n)
}

// counted returns the item count withCounted recorded, if any.
func counted(ctx context.Context) (int, bool) {
	n, ok := ctx.Value(countedKey{}).(int)
	return n, ok
}

// countFirst wraps a method's handler so its request's items are counted
// before it is decoded; limit says how many the caller may send. Methods
// whose item field is not a list (one URI per request) or that have none
// are left as they are.
func (m *method) countFirst(h grpc.MethodHandler, limit func(context.Context) int) grpc.MethodHandler {
	if m.items == nil || !m.items.field.IsList() {
		return h
	}
	return func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		var raw rawRequest
		if err := dec(&raw); err != nil {
			return nil, err
		}
		defer raw.free()
		n, err := m.items.countSlice(raw.data)
		if err != nil {
			// Not decoded: a message with a million items and a bad
			// tail would be decoded whole before the tail failed.
			raw.free()
			received(ctx, 0)
			return h(srv, ctx, func(v any) error { return invalidRequest(v.(proto.Message), err) }, interceptor)
		}
		if n > limit(ctx) {
			raw.free()
			received(ctx, 0)
			return h(srv, withCounted(ctx, n), func(any) error { return nil }, interceptor)
		}
		// The bytes go back to the pool once decoded, not when the
		// handler returns: the decoded request holds copies. A batch
		// over max_items (one its caller may split) is held decoded
		// while its pieces wait for admission, outside the item
		// capacity: that much stays reserved until the stream ends.
		keep := membudget.Bytes(0)
		if n > m.policy.MaxItems {
			keep = decodedBytes(raw.data.Len(), n)
		}
		return h(srv, ctx, func(v any) error {
			buf := raw.data.MaterializeToBuffer(mem.DefaultBufferPool())
			raw.free()
			defer func() {
				buf.Free()
				received(ctx, keep)
			}()
			return decode(buf.ReadOnlyData(), v)
		}, interceptor)
	}
}

// limitOf returns how many items the caller of m may send: max_items,
// or more for a client m's policy lets split (naming the caller only
// then, so that other methods do not pay for it twice).
func (s *Server) limitOf(m *method) func(context.Context) int {
	if len(m.policy.Oversize) == 0 {
		return func(context.Context) int { return m.policy.MaxItems }
	}
	return func(ctx context.Context) int {
		id := s.identifyOnce(ctx)
		if id.err != nil {
			return m.policy.MaxItems
		}
		return s.maxItemsFor(m, id.client)
	}
}

// decode unmarshals a request; bytes that are not a valid message are
// the caller's mistake, so they get InvalidArgument saying so.
func decode(b []byte, v any) error {
	msg := v.(proto.Message)
	if err := proto.Unmarshal(b, msg); err != nil {
		return invalidRequest(msg, err)
	}
	return nil
}

// invalidRequest is the InvalidArgument for a request whose bytes are not
// a valid msg.
func invalidRequest(msg proto.Message, err error) error {
	return status.Errorf(codes.InvalidArgument, "the request is not a valid %s: %v", msg.ProtoReflect().Descriptor().FullName(), err)
}

// countSlice is count over a request's bytes as the transport holds
// them, without first copying them into one buffer.
func (f *itemField) countSlice(data mem.BufferSlice) (int, error) {
	if len(data) == 1 {
		return f.count(data[0].ReadOnlyData())
	}
	r := data.Reader()
	defer r.Close()
	num, n := f.field.Number(), 0
	for r.Remaining() > 0 {
		at := data.Len() - r.Remaining()
		tag, err := binary.ReadUvarint(r)
		if err != nil {
			return 0, unparsable(at)
		}
		got, typ := protowire.DecodeTag(tag)
		if typ == protowire.StartGroupType || typ == protowire.EndGroupType {
			return 0, groupField(got)
		}
		skip, ok := fieldLength(r, typ)
		if !ok || got < protowire.MinValidNumber || skip > uint64(r.Remaining()) {
			return 0, unparsable(at)
		}
		if _, err := r.Discard(int(skip)); err != nil {
			return 0, unparsable(at)
		}
		if got == num {
			n++
		}
	}
	return n, nil
}

// fieldLength reads what precedes a field's value and returns the bytes
// left to skip; false for a wire type it does not know and for bytes
// that do not parse.
func fieldLength(r *mem.Reader, typ protowire.Type) (uint64, bool) {
	switch typ {
	case protowire.VarintType:
		_, err := binary.ReadUvarint(r)
		return 0, err == nil
	case protowire.Fixed32Type:
		return 4, true
	case protowire.Fixed64Type:
		return 8, true
	case protowire.BytesType:
		l, err := binary.ReadUvarint(r)
		return l, err == nil
	}
	return 0, false
}

// count returns how many elements of the item list b, a request's wire
// bytes, holds, without decoding them. Bytes that do not parse and group
// fields (deprecated; no request of sluice's defines one) are the
// caller's mistake, reported here: left to the decoder, they would be
// found only after every item before them was decoded.
func (f *itemField) count(b []byte) (int, error) {
	num, n, at := f.field.Number(), 0, 0
	for len(b) > 0 {
		got, typ, length := protowire.ConsumeField(b)
		switch {
		case length < 0:
			return 0, unparsable(at)
		case typ == protowire.StartGroupType:
			return 0, groupField(got)
		case got == num:
			n++
		}
		b, at = b[length:], at+length
	}
	return n, nil
}

// unparsable says where a request's bytes stop parsing as protobuf.
func unparsable(at int) error {
	return fmt.Errorf("its bytes do not parse as protobuf from byte %d", at)
}

// groupField says that a request holds a group.
func groupField(num protowire.Number) error {
	return fmt.Errorf("field %d is a group, which no request of this service holds", num)
}
