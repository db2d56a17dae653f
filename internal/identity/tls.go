package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Values of TLSConfig.Unlisted.
const (
	UnlistedDeny    = "deny"    // refuse clients not in AllowedClients
	UnlistedDefault = "default" // serve them under DefaultClient
)

// TLSConfig turns on mutual TLS. With it, a caller's name is the first
// URI SAN of its verified client certificate (e.g.
// spiffe://sluice.internal/feed), or its first DNS SAN when it has no URI
// SAN; a claimed name (x-client-id, x-atlantis-caller) that disagrees is
// refused, and so is — unless Unlisted says otherwise — a name missing
// from AllowedClients. The zero value leaves TLS off.
type TLSConfig struct {
	// CertFile and KeyFile are the server's certificate and key (PEM).
	CertFile string `yaml:"cert"`
	KeyFile  string `yaml:"key"`
	// ClientCAFile holds the CA certificates (PEM) client certificates
	// must chain to.
	ClientCAFile string `yaml:"client_ca"`
	// AllowedClients lists the names that may call. Empty: any client
	// with a verified certificate may.
	AllowedClients []string `yaml:"allowed_clients"`
	// Unlisted is what happens to a verified client not in
	// AllowedClients: "deny" (default) or "default".
	Unlisted string `yaml:"unlisted"`
	// DefaultClient is the name an unlisted client is served under when
	// Unlisted is "default" (so that admission and metrics give it that
	// name's budget). Default "unlisted".
	DefaultClient string `yaml:"default_client"`
}

// Enabled reports whether TLS is configured.
func (c TLSConfig) Enabled() bool { return c.CertFile != "" || c.KeyFile != "" || c.ClientCAFile != "" }

// Validate checks that TLS is configured whole or not at all.
func (c TLSConfig) Validate() error {
	if !c.Enabled() {
		if len(c.AllowedClients) > 0 {
			return errors.New("tls: allowed_clients needs TLS; set --tls-cert, --tls-key and --client-ca")
		}
		return nil
	}
	var errs []error
	for name, v := range map[string]string{"cert (--tls-cert)": c.CertFile, "key (--tls-key)": c.KeyFile, "client_ca (--client-ca)": c.ClientCAFile} {
		if v == "" {
			errs = append(errs, fmt.Errorf("tls: %s is required when TLS is on", name))
		}
	}
	for i, name := range c.AllowedClients {
		if err := CheckName(name); err != nil {
			errs = append(errs, fmt.Errorf("tls: allowed_clients[%d]: %w", i, err))
		}
	}
	if c.DefaultClient != "" {
		if err := CheckName(c.DefaultClient); err != nil {
			errs = append(errs, fmt.Errorf("tls: default_client: %w", err))
		}
	}
	if c.Unlisted != "" && c.Unlisted != UnlistedDeny && c.Unlisted != UnlistedDefault {
		errs = append(errs, fmt.Errorf("tls: unlisted must be %q or %q, got %q", UnlistedDeny, UnlistedDefault, c.Unlisted))
	}
	return errors.Join(errs...)
}

// ServerTLS loads the files into a server config that requires and
// verifies client certificates (TLS 1.2 or later).
func (c TLSConfig) ServerTLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: server certificate: %w", err)
	}
	pem, err := os.ReadFile(c.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("tls: client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls: client CA %s holds no PEM certificate", c.ClientCAFile)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// DeniedError says why a caller may not call; the guard answers it with
// PermissionDenied.
type DeniedError struct{ Reason string }

func (e *DeniedError) Error() string { return e.Reason }

// Resolver names callers from their certificates under a TLSConfig.
type Resolver struct {
	cfg TLSConfig
}

// NewResolver returns a Resolver for c (which must be valid).
func NewResolver(c TLSConfig) *Resolver {
	if c.DefaultClient == "" {
		c.DefaultClient = "unlisted"
	}
	return &Resolver{cfg: c}
}

// Resolve returns the caller's name, or a *DeniedError when its
// certificate names no one, its claimed name disagrees, or it is not
// allowed.
func (r *Resolver) Resolve(ctx context.Context) (string, error) {
	name, ok := FromPeer(ctx)
	if !ok {
		return "", &DeniedError{Reason: "no verified client certificate naming the caller (a URI or DNS SAN is required)"}
	}
	if err := CheckName(name); err != nil {
		return "", &DeniedError{Reason: fmt.Sprintf("the client certificate's name cannot be told apart from others: %v; issue a certificate whose first URI SAN (or, without one, first DNS SAN) is 1 to %d bytes of printable ASCII", err, MaxNameLength)}
	}
	if claimed := FromIncoming(ctx); claimed != Unknown && claimed != name {
		return "", &DeniedError{Reason: fmt.Sprintf("the claimed client name %q disagrees with the client certificate's name %q; drop the x-client-id / x-atlantis-caller header or send the certificate's name", claimed, name)}
	}
	if len(r.cfg.AllowedClients) == 0 || slices.Contains(r.cfg.AllowedClients, name) {
		return name, nil
	}
	if r.cfg.Unlisted == UnlistedDefault {
		return r.cfg.DefaultClient, nil
	}
	return "", &DeniedError{Reason: fmt.Sprintf("client %q is not in tls.allowed_clients", name)}
}

// FromPeer returns the name in the caller's verified client certificate:
// its first URI SAN, else its first DNS SAN, as written (Resolve refuses
// one that CheckName does not accept, rather than cut or clean it into
// another certificate's name). It reports false when the connection is
// not TLS, the chain was not verified, or the certificate names no one.
func FromPeer(ctx context.Context) (string, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", false
	}
	leaf := info.State.VerifiedChains[0][0]
	var name string
	switch {
	case len(leaf.URIs) > 0:
		name = leaf.URIs[0].String()
	case len(leaf.DNSNames) > 0:
		name = leaf.DNSNames[0]
	}
	return name, name != ""
}
