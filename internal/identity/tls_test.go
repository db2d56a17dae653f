package identity

import (
	"context"
	"strings"
	"testing"
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
