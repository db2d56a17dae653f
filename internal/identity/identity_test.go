package identity

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
)

func TestFromIncoming(t *testing.T) {
	for _, tc := range []struct {
		name string
		md   metadata.MD
		want string
	}{
		{name: "no metadata", md: nil, want: Unknown},
		{name: "client id", md: metadata.Pairs(ClientIDKey, "feed"), want: "feed"},
		{name: "atlantis caller", md: metadata.Pairs(AtlantisCallerKey, "appview"), want: "appview"},
		{name: "client id wins", md: metadata.Pairs(ClientIDKey, "feed", AtlantisCallerKey, "appview"), want: "feed"},
		{name: "blank falls through", md: metadata.Pairs(ClientIDKey, "  ", AtlantisCallerKey, "appview"), want: "appview"},
		{name: "control bytes replaced", md: metadata.Pairs(ClientIDKey, "a b\tc"), want: "a_b_c"},
		{name: "long name cut", md: metadata.Pairs(ClientIDKey, strings.Repeat("x", 500)), want: strings.Repeat("x", MaxNameLength)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.md != nil {
				ctx = metadata.NewIncomingContext(ctx, tc.md)
			}
			if got := FromIncoming(ctx); got != tc.want {
				t.Errorf("FromIncoming = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestClientRoundTrip(t *testing.T) {
	if got := Client(context.Background()); got != Unknown {
		t.Errorf("Client(empty) = %q, want %q", got, Unknown)
	}
	if got := Client(WithClient(context.Background(), "bulk")); got != "bulk" {
		t.Errorf("Client = %q, want bulk", got)
	}
}

// Tests that FromMetadata names the caller from a stream's headers as
// FromIncoming does from the incoming metadata.
func TestFromMetadataAgreesWithFromIncoming(t *testing.T) {
	for _, md := range []metadata.MD{
		nil,
		metadata.Pairs(ClientIDKey, "feed"),
		metadata.Pairs(AtlantisCallerKey, "appview"),
		metadata.Pairs(ClientIDKey, "feed", AtlantisCallerKey, "appview"),
		metadata.Pairs(ClientIDKey, "  ", AtlantisCallerKey, "appview"),
		metadata.Pairs(ClientIDKey, "a b\tc"),
	} {
		want := FromIncoming(metadata.NewIncomingContext(context.Background(), md))
		if got := FromMetadata(md); got != want {
			t.Errorf("FromMetadata(%v) = %q, FromIncoming %q", md, got, want)
		}
	}
}
