// Package identity names the caller of each request.
//
// A caller names itself with the gRPC metadata key x-client-id, or with
// x-atlantis-caller, the header the AT Protocol AppView's data-plane client
// sends. A request without either is attributed to "unknown". Without TLS
// that claim is trusted as is. With mutual TLS (TLSConfig, Resolver) the
// name comes from the caller's verified certificate instead, a claim that
// disagrees is refused, and an allow-list says who may call. The name is
// carried in the context so that metrics and admission can use it; this
// package does not bound how many names exist (metrics do that when they
// turn names into labels) and does not choose gRPC codes (the guard
// does).
package identity

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/metadata"
)

// Metadata keys a caller may use to name itself, in order of preference.
const (
	ClientIDKey       = "x-client-id"
	AtlantisCallerKey = "x-atlantis-caller"
)

// Unknown is the name of a caller that did not name itself.
const Unknown = "unknown"

// MaxNameLength bounds a caller's name; longer names are cut.
const MaxNameLength = 64

type clientKey struct{}

// FromIncoming returns the caller's name from the incoming gRPC metadata.
func FromIncoming(ctx context.Context) string {
	// ValueFromIncomingContext reads one key without copying the whole
	// metadata, as FromIncomingContext does.
	return nameOf(func(key string) []string { return metadata.ValueFromIncomingContext(ctx, key) })
}

// FromMetadata returns the caller's name from md, a request's metadata as
// the transport received it (a stream's tap.Info.Header): its keys are
// lower case, as HTTP/2 requires of header names, so each key is one map
// lookup and nothing is copied. It names the caller as FromIncoming does.
func FromMetadata(md metadata.MD) string {
	return nameOf(func(key string) []string { return md[key] })
}

// nameOf returns the caller's name from the first of the keys a caller
// may name itself with that values gives a name.
func nameOf(values func(key string) []string) string {
	for _, key := range [...]string{ClientIDKey, AtlantisCallerKey} {
		if vals := values(key); len(vals) > 0 {
			if name := clean(vals[0]); name != "" {
				return name
			}
		}
	}
	return Unknown
}

// WithClient returns a context carrying the caller's name.
func WithClient(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, clientKey{}, name)
}

// Client returns the caller's name carried by ctx, or Unknown.
func Client(ctx context.Context) string {
	if name, ok := ctx.Value(clientKey{}).(string); ok {
		return name
	}
	return Unknown
}

// CheckName reports why name cannot name a caller as written: it is
// empty, over MaxNameLength bytes, or holds a character other than
// printable ASCII (a space or control character included). A claimed
// name like that is cleaned, so two such names can become one; a
// certificate's is refused (Resolver), and one in the config could never
// match a caller.
func CheckName(name string) error {
	switch {
	case name == "":
		return errors.New("a client name is empty")
	case len(name) > MaxNameLength:
		return fmt.Errorf("client name %.80q is %d bytes, over the limit of %d", name, len(name), MaxNameLength)
	case clean(name) != name:
		return fmt.Errorf("client name %.80q holds a character other than printable ASCII (spaces and control characters included)", name)
	}
	return nil
}

// clean keeps names printable and short so they are safe in logs and labels.
func clean(name string) string {
	name = strings.TrimSpace(name)
	var b strings.Builder
	for _, r := range name {
		if b.Len() >= MaxNameLength {
			break
		}
		if r > ' ' && r < 0x7f {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}
