package app

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/identity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// testCA is a throwaway certificate authority.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a leaf certificate for tmpl's names, signed by the CA.
func (ca *testCA) issue(t *testing.T, tmpl *x509.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = serial, time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// writeServerFiles writes the server's cert, key and the client CA.
func writeServerFiles(t *testing.T, ca *testCA) identity.TLSConfig {
	t.Helper()
	dir := t.TempDir()
	srv := ca.issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "sluice"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
	keyDER, err := x509.MarshalPKCS8PrivateKey(srv.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"server.pem": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate[0]}),
		"server.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		"ca.pem":     ca.pem,
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return identity.TLSConfig{CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server.key"), ClientCAFile: filepath.Join(dir, "ca.pem")}
}

// Tests mutual TLS through the real server: a client is named by its
// certificate (URI or DNS SAN); a claimed name that disagrees, a client
// not in the allow-list, a certificate from another CA and a plaintext
// client are all refused; with unlisted: default an unlisted client is
// served under the default name.
func TestMutualTLS(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	spiffe, _ := url.Parse("spiffe://sluice.test/feed")
	feed := ca.issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "feed"}, URIs: []*url.URL{spiffe}})
	search := ca.issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "search"}, DNSNames: []string{"search.sluice.test"}})
	stranger := ca.issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "stranger"}, DNSNames: []string{"stranger.sluice.test"}})
	forged := other.issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "feed"}, URIs: []*url.URL{spiffe}})

	for _, unlisted := range []string{identity.UnlistedDeny, identity.UnlistedDefault} {
		t.Run("unlisted="+unlisted, func(t *testing.T) {
			var addr string
			ts := startServer(t, 10, func(c *Config) {
				c.TLS = writeServerFiles(t, ca)
				c.TLS.AllowedClients = []string{"spiffe://sluice.test/feed", "search.sluice.test"}
				c.TLS.Unlisted = unlisted
			})
			addr = ts.conn.Target()
			uris := []string{ts.posts[0].URI}
			call := func(cert *tls.Certificate, claimed string) *status.Status {
				t.Helper()
				creds := insecure.NewCredentials()
				if cert != nil {
					pool := x509.NewCertPool()
					pool.AppendCertsFromPEM(ca.pem)
					creds = credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{*cert}, RootCAs: pool, MinVersion: tls.VersionTLS12})
				}
				conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				ctx := ts.ctx("")
				if claimed != "" {
					ctx = metadata.AppendToOutgoingContext(ctx, "x-atlantis-caller", claimed)
				}
				_, err = sluicev1.NewPostRecordsClient(conn).GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris})
				return status.Convert(err)
			}
			cases := []struct {
				name    string
				cert    *tls.Certificate
				claimed string
				code    codes.Code
				msg     string
			}{
				{"uri san", &feed, "", codes.OK, ""},
				{"claim agrees", &feed, "spiffe://sluice.test/feed", codes.OK, ""},
				{"dns san", &search, "", codes.OK, ""},
				{"claim disagrees", &search, "feed", codes.PermissionDenied, `claimed client name "feed" disagrees with the client certificate's name "search.sluice.test"`},
				{"other CA", &forged, "", codes.Unavailable, ""},
				{"plaintext", nil, "", codes.Unavailable, ""},
			}
			if unlisted == identity.UnlistedDeny {
				cases = append(cases, struct {
					name    string
					cert    *tls.Certificate
					claimed string
					code    codes.Code
					msg     string
				}{"not allowed", &stranger, "", codes.PermissionDenied, `client "stranger.sluice.test" is not in tls.allowed_clients`})
			} else {
				cases = append(cases, struct {
					name    string
					cert    *tls.Certificate
					claimed string
					code    codes.Code
					msg     string
				}{"served as default", &stranger, "", codes.OK, ""})
			}
			for _, tc := range cases {
				st := call(tc.cert, tc.claimed)
				if st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
					t.Errorf("%s: got %s %q, want %s containing %q", tc.name, st.Code(), st.Message(), tc.code, tc.msg)
				}
			}
			fams := ts.metrics()
			if n := fams.Sum("sluice_rejections_total", map[string]string{"reason": "identity"}); n == 0 {
				t.Errorf("identity rejections not counted")
			}
			if n := fams.Sum("sluice_store_reads_total", nil) + float64(ts.app.Cache.Stats()[0].Hits); n == 0 {
				t.Errorf("no allowed request reached the read path")
			}
		})
	}
}
