package guard

import (
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// An item is one URI a request asks the server to work on. The guard finds
// a method's items from its request message, by convention:
//
//   - a repeated string field named "uris": one item per element;
//   - a string field named "uri": one item;
//   - a repeated message field whose messages have a string field "uri"
//     (e.g. "records"): one item per element.
//
// A request type with none of these has no items; it costs one and has
// no shape to check.
type itemField struct {
	field    protoreflect.FieldDescriptor
	uriField protoreflect.FieldDescriptor // set for repeated messages
	name     string                       // as callers see it: "uris", "records"
}

// findItemField picks the item field of a request message type, or nil.
func findItemField(md protoreflect.MessageDescriptor) *itemField {
	fields := md.Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		switch {
		case f.Name() == "uris" && f.IsList() && f.Kind() == protoreflect.StringKind:
			return &itemField{field: f, name: "uris"}
		case f.Name() == "uri" && !f.IsList() && f.Kind() == protoreflect.StringKind:
			return &itemField{field: f, name: "uri"}
		case f.IsList() && f.Kind() == protoreflect.MessageKind:
			if u := f.Message().Fields().ByName("uri"); u != nil && u.Kind() == protoreflect.StringKind && !u.IsList() {
				return &itemField{field: f, uriField: u, name: string(f.Name())}
			}
		}
	}
	return nil
}

// items returns the URIs a request carries, in order. A repeated "uris"
// field is answered with the request's own slice through its generated
// getter (no copy, no reflection): callers only read it.
func (f *itemField) items(req proto.Message) []string {
	if f.name == "uris" {
		if r, ok := req.(interface{ GetUris() []string }); ok {
			return r.GetUris()
		}
	}
	return f.reflected(req)
}

// reflected reads the items through protobuf reflection: every shape of
// item field, for any request type.
func (f *itemField) reflected(req proto.Message) []string {
	m := req.ProtoReflect()
	v := m.Get(f.field)
	if !f.field.IsList() {
		return []string{v.String()}
	}
	list := v.List()
	out := make([]string, list.Len())
	for i := range out {
		if f.uriField != nil {
			out[i] = list.Get(i).Message().Get(f.uriField).String()
		} else {
			out[i] = list.Get(i).String()
		}
	}
	return out
}

// checkShape enforces a policy's request shape: at least one item, at most
// MaxItems, each URI non-empty and at most MaxURILength bytes. The error
// is an InvalidArgument status that names the limit and how to comply.
func checkShape(method string, f *itemField, items []string, p Policy) error {
	n := len(items)
	switch {
	case n == 0:
		return badRequest(f.name, fmt.Sprintf("%s: the request has no %s; send between 1 and %d per request", method, f.name, p.MaxItems))
	case n > p.MaxItems:
		return tooManyItems(method, f, n, p)
	}
	for i, uri := range items {
		switch {
		case uri == "":
			field := itemPath(f, i)
			return badRequest(field, fmt.Sprintf("%s: %s is empty; every item needs an AT-URI", method, field))
		case len(uri) > p.MaxURILength:
			field := itemPath(f, i)
			return badRequest(field, fmt.Sprintf("%s: %s is %d bytes, over the limit of %d bytes per URI", method, field, len(uri), p.MaxURILength))
		}
	}
	return nil
}

// tooManyItems is the refusal of a batch of n items, over MaxItems.
func tooManyItems(method string, f *itemField, n int, p Policy) error {
	return badRequest(f.name, fmt.Sprintf("%s: %d %s exceeds the limit of %d per request; split the batch into requests of at most %d", method, n, f.name, p.MaxItems, p.MaxItems))
}

func itemPath(f *itemField, i int) string {
	switch {
	case !f.field.IsList():
		return f.name
	case f.uriField != nil:
		return fmt.Sprintf("%s[%d].uri", f.name, i)
	default:
		return fmt.Sprintf("%s[%d]", f.name, i)
	}
}

// badRequest builds an InvalidArgument status with a BadRequest detail.
func badRequest(field, msg string) error {
	return InvalidArgument(field, msg)
}

// InvalidArgument is the one way sluice reports a malformed request: an
// InvalidArgument status whose message says what was wrong and the limit,
// carrying a google.rpc.BadRequest field violation for field.
func InvalidArgument(field, msg string) error {
	st := status.New(codes.InvalidArgument, msg)
	detailed, err := st.WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: msg}},
	})
	if err != nil {
		return st.Err()
	}
	return detailed.Err()
}
