package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// Tests that TLS is configured whole or not at all, with messages that
// name the missing flag or the bad value.
func TestTLSConfigValidate(t *testing.T) {
	full := TLSConfig{CertFile: "s.pem", KeyFile: "s.key", ClientCAFile: "ca.pem"}
	for _, tc := range []struct {
		name string
		cfg  TLSConfig
		want string
	}{
		{"off", TLSConfig{}, ""},
		{"full", full, ""},
		{"allow-list without TLS", TLSConfig{AllowedClients: []string{"feed"}}, "allowed_clients needs TLS"},
		{"no key", TLSConfig{CertFile: "s.pem", ClientCAFile: "ca.pem"}, "key (--tls-key) is required"},
		{"no client CA", TLSConfig{CertFile: "s.pem", KeyFile: "s.key"}, "client_ca (--client-ca) is required"},
		{"bad unlisted", TLSConfig{CertFile: "s.pem", KeyFile: "s.key", ClientCAFile: "ca.pem", Unlisted: "allow"}, `unlisted must be "deny" or "default", got "allow"`},
		{"allowed name too long", TLSConfig{CertFile: "s.pem", KeyFile: "s.key", ClientCAFile: "ca.pem", AllowedClients: []string{"feed", strings.Repeat("a", 65)}}, "allowed_clients[1]: client name"},
		{"allowed name with a space", TLSConfig{CertFile: "s.pem", KeyFile: "s.key", ClientCAFile: "ca.pem", AllowedClients: []string{"my feed"}}, "other than printable ASCII"},
		{"default name with a tab", TLSConfig{CertFile: "s.pem", KeyFile: "s.key", ClientCAFile: "ca.pem", DefaultClient: "un\tlisted"}, "default_client: client name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
}

// Tests that a connection without a verified certificate is refused,
// whatever name it claims.
func TestResolveWithoutCertificate(t *testing.T) {
	_, err := NewResolver(TLSConfig{}).Resolve(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no verified client certificate") {
		t.Errorf("Resolve without a peer = %v, want a refusal", err)
	}
}

// verifiedPeer is a context whose connection presented a verified
// certificate naming uri (a URI SAN) or, when uri is not a URL with a
// scheme, dns (a DNS SAN), and claimed the name claimed (none if empty).
func verifiedPeer(t *testing.T, uri, dns, claimed string) context.Context {
	t.Helper()
	leaf := &x509.Certificate{}
	if uri != "" {
		u, err := url.Parse(uri)
		if err != nil {
			t.Fatal(err)
		}
		leaf.URIs = []*url.URL{u}
	}
	if dns != "" {
		leaf.DNSNames = []string{dns}
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{
		State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf}}}}})
	if claimed != "" {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(ClientIDKey, claimed))
	}
	return ctx
}

// Tests that a certificate is named by its SAN as written, and that one
// whose name could not be told apart from another's (over 64 bytes, or
// with characters cleaning would change) is refused rather than cut or
// cleaned into the other's name.
func TestResolveRefusesCertificateNamesThatCollide(t *testing.T) {
	victim := "spiffe://prod.example.com/ns/appview/sa/dataplane-client"
	r := NewResolver(TLSConfig{AllowedClients: []string{victim}})
	if name, err := r.Resolve(verifiedPeer(t, victim, "", "")); err != nil || name != victim {
		t.Fatalf("the listed certificate: %q, %v; want %q", name, err, victim)
	}
	long := victim + "-interactive-canary-0001"
	for name, ctx := range map[string]context.Context{
		"URI SAN over 64 bytes":   verifiedPeer(t, long, "", ""),
		"and claiming the victim": verifiedPeer(t, long, "", victim),
		"DNS SAN with a space":    verifiedPeer(t, "", " feed", ""),
		"DNS SAN with a control":  verifiedPeer(t, "", "fe\x01ed", ""),
		"DNS SAN over 64 bytes":   verifiedPeer(t, "", strings.Repeat("a", 70)+".example", ""),
	} {
		got, err := NewResolver(TLSConfig{}).Resolve(ctx)
		if err == nil || !strings.Contains(err.Error(), "cannot be told apart") {
			t.Errorf("%s: Resolve = %q, %v; want a refusal saying why", name, got, err)
		}
	}
}
