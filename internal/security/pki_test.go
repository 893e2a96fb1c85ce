package security_test

// Tests of the certificate authority, the token file and the TLS
// loaders (the RPC authorisation tests are in security_test.go).

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gradsync/gradsync/internal/security"
	"google.golang.org/grpc/credentials"
)

func TestInitCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	p, err := security.InitCerts(dir, security.CertOptions{Hosts: []string{"coord.example", "10.0.0.7"}, WorkerHosts: []string{"w1.example"}})
	if err != nil {
		t.Fatal(err)
	}
	modes := map[string]fs.FileMode{p.CA: 0o644, p.CAKey: 0o600, p.ServerCert: 0o644, p.ServerKey: 0o600,
		p.WorkerCert: 0o644, p.WorkerKey: 0o600, p.Token: 0o600}
	for path, want := range modes {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s mode %v, want %v", path, st.Mode().Perm(), want)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != len(modes) {
		t.Errorf("%d entries in %s (temporary files left?)", len(ents), dir)
	}
	srv := leaf(t, p.ServerCert, p.ServerKey)
	wrk := leaf(t, p.WorkerCert, p.WorkerKey)
	if !slicesEq(srv.DNSNames, []string{"coord.example"}) || len(srv.IPAddresses) != 1 || !srv.IPAddresses[0].Equal(net.ParseIP("10.0.0.7")) {
		t.Errorf("server SANs %v %v", srv.DNSNames, srv.IPAddresses)
	}
	if !slicesEq(wrk.DNSNames, []string{"w1.example"}) {
		t.Errorf("worker SANs %v", wrk.DNSNames)
	}
	if !security.HasRole(wrk, security.WorkerRoleURI) || security.HasRole(srv, security.WorkerRoleURI) || !security.HasRole(srv, security.ServerRoleURI) {
		t.Errorf("roles: worker %v server %v", wrk.URIs, srv.URIs)
	}
	for _, c := range []*x509.Certificate{srv, wrk} {
		if len(c.ExtKeyUsage) != 2 {
			t.Errorf("%s EKU %v, want server and client auth", c.Subject.CommonName, c.ExtKeyUsage)
		}
		if c.PublicKeyAlgorithm != x509.ECDSA {
			t.Errorf("%s key %v", c.Subject.CommonName, c.PublicKeyAlgorithm)
		}
	}
	before, _ := os.ReadFile(p.ServerKey)

	// Refuses to overwrite, and touches nothing.
	if _, err := security.InitCerts(dir, security.CertOptions{}); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second InitCerts: %v", err)
	}
	if after, _ := os.ReadFile(p.ServerKey); string(after) != string(before) {
		t.Error("refused InitCerts changed the server key")
	}
	// One file is enough to refuse.
	dir2 := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir2, security.TokenFile), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := security.InitCerts(dir2, security.CertOptions{}); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("InitCerts over a token: %v", err)
	}
	// Force replaces everything.
	if _, err := security.InitCerts(dir, security.CertOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(p.ServerKey); string(after) == string(before) {
		t.Error("forced InitCerts kept the server key")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != len(modes) {
		t.Errorf("%d entries after Force", len(ents))
	}
	// Default hosts include loopback.
	d := leaf(t, p.ServerCert, p.ServerKey)
	if !slicesEq(d.DNSNames[:1], []string{"localhost"}) || len(d.IPAddresses) != 2 {
		t.Errorf("default SANs %v %v", d.DNSNames, d.IPAddresses)
	}
}

func leaf(t *testing.T, cert, key string) *x509.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func slicesEq(a, b []string) bool {
	return strings.Join(a, "\x00") == strings.Join(b, "\x00")
}

func TestLoadTokens(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tokens")
	if err := os.WriteFile(file, []byte("# accepted\n\n  first-token-0123456789  \nsecond-token-0123456789\nfirst-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GRADSYNC_TEST_TOKEN", "env-token-0123456789")
	toks, err := security.LoadTokens(file, "GRADSYNC_TEST_TOKEN")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range toks {
		got = append(got, string(b))
	}
	if !slicesEq(got, []string{"first-token-0123456789", "second-token-0123456789", "env-token-0123456789"}) {
		t.Errorf("tokens %q", got)
	}
	if toks, err := security.LoadTokens("", "GRADSYNC_TEST_UNSET"); err != nil || toks != nil {
		t.Errorf("nothing configured: %q %v", toks, err)
	}
	short := filepath.Join(dir, "short")
	_ = os.WriteFile(short, []byte("abc\n"), 0o600)
	if _, err := security.LoadTokens(short, ""); err == nil {
		t.Error("short token accepted")
	}
	empty := filepath.Join(dir, "empty")
	_ = os.WriteFile(empty, []byte("# nothing\n"), 0o600)
	if _, err := security.LoadTokens(empty, ""); err == nil {
		t.Error("file without a token accepted")
	}
	if _, err := security.LoadTokens(filepath.Join(dir, "missing"), ""); err == nil {
		t.Error("missing file accepted")
	}
	if tok, err := security.NewToken(); err != nil || len(tok) != 43 {
		t.Errorf("NewToken %q %v", tok, err)
	}
}

func TestTLSLoaders(t *testing.T) {
	f := newFixture(t)
	if f.server.MinVersion != tls.VersionTLS13 || f.server.ClientAuth != tls.VerifyClientCertIfGiven {
		t.Errorf("ServerTLS %v %v", f.server.MinVersion, f.server.ClientAuth)
	}
	if f.peer.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("PeerServerTLS %v", f.peer.ClientAuth)
	}
	if c, err := security.ServerTLS(f.paths.ServerCert, f.paths.ServerKey, ""); err != nil || c.ClientAuth != tls.NoClientCert {
		t.Errorf("ServerTLS without CA: %v", err)
	}
	if _, err := security.PeerServerTLS(f.paths.WorkerCert, f.paths.WorkerKey, ""); err == nil {
		t.Error("PeerServerTLS without CA")
	}
	if _, err := security.ClientTLS(f.paths.CA, f.paths.WorkerCert, ""); err == nil {
		t.Error("ClientTLS with a certificate but no key")
	}
	if _, err := security.ClientTLS(f.paths.Token, "", ""); err == nil {
		t.Error("ClientTLS with a CA file holding no certificate")
	}
	var _ credentials.TransportCredentials = security.Credentials(f.api)
}
