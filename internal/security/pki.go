package security

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"
)

// Role URIs. A gradsync certificate carries exactly one of them as a URI
// subject alternative name; the worker URI is what the authoriser checks
// (the Subject's OU is not consulted). Hostnames are checked separately, by
// the ordinary TLS rules, from the DNS and IP SANs.
const (
	WorkerRoleURI = "spiffe://gradsync/worker"
	ServerRoleURI = "spiffe://gradsync/server"
)

// File names written by InitCerts, inside its directory.
const (
	CAFile         = "ca.pem"
	CAKeyFile      = "ca-key.pem"
	ServerCertFile = "server.pem"
	ServerKeyFile  = "server-key.pem"
	WorkerCertFile = "worker.pem"
	WorkerKeyFile  = "worker-key.pem"
	TokenFile      = "token"
)

// DefaultValidity is how long development certificates are valid.
const DefaultValidity = 365 * 24 * time.Hour

// CertOptions says what InitCerts and EphemeralPKI issue.
type CertOptions struct {
	// Hosts are the DNS names and IP addresses put in the server
	// certificate. Empty: DefaultHosts().
	Hosts []string
	// WorkerHosts are the names and addresses put in the worker
	// certificate (workers also serve their Collective endpoint). Empty:
	// the same as Hosts. Peers are verified by CA and role, not by name
	// (see PeerClientTLS), so these only matter to clients that verify
	// names.
	WorkerHosts []string
	// Validity of the issued certificates (the CA lives twice as long).
	// Zero: DefaultValidity.
	Validity time.Duration
	// Force overwrites existing files; without it InitCerts refuses to
	// touch a directory that already holds any of its files.
	Force bool
}

// Paths are the files InitCerts wrote.
type Paths struct {
	Dir                   string
	CA, CAKey             string
	ServerCert, ServerKey string
	WorkerCert, WorkerKey string
	Token                 string
}

// DefaultHosts are localhost, 127.0.0.1, ::1 and this machine's host name.
func DefaultHosts() []string {
	h := []string{"localhost", "127.0.0.1", "::1"}
	if name, err := os.Hostname(); err == nil && name != "" && name != "localhost" {
		h = append(h, name)
	}
	return h
}

// PKI is a complete development PKI held in memory: a CA, a server and a
// worker key pair, and a client token. Its methods return ready TLS
// configurations, so `gradsync local` can run mTLS on loopback without
// files.
type PKI struct {
	CA     *x509.Certificate
	CAPEM  []byte
	Pool   *x509.CertPool
	Server tls.Certificate
	Worker tls.Certificate
	// Token is the client API token (printable, 43 characters).
	Token string

	caKey *ecdsa.PrivateKey
	// PEM encodings, for InitCerts.
	caKeyPEM, serverPEM, serverKeyPEM, workerPEM, workerKeyPEM []byte
}

// EphemeralPKI issues a CA, a server certificate for hosts (empty:
// DefaultHosts()), a worker certificate for the same hosts and a token, in
// memory.
func EphemeralPKI(hosts []string) (*PKI, error) {
	return newPKI(CertOptions{Hosts: hosts})
}

// InitCerts writes a development PKI into dir (created 0700 if missing):
// ca.pem, ca-key.pem, server.pem, server-key.pem, worker.pem,
// worker-key.pem and token. Keys and the token are 0600, certificates 0644.
// Each file is written to a temporary file, synced and then linked into
// place, so a reader never sees half a file; without opt.Force an existing
// file is never replaced and the call fails with an error wrapping
// fs.ErrExist.
func InitCerts(dir string, opt CertOptions) (Paths, error) {
	p := Paths{
		Dir:        dir,
		CA:         filepath.Join(dir, CAFile),
		CAKey:      filepath.Join(dir, CAKeyFile),
		ServerCert: filepath.Join(dir, ServerCertFile),
		ServerKey:  filepath.Join(dir, ServerKeyFile),
		WorkerCert: filepath.Join(dir, WorkerCertFile),
		WorkerKey:  filepath.Join(dir, WorkerKeyFile),
		Token:      filepath.Join(dir, TokenFile),
	}
	if dir == "" {
		return Paths{}, errors.New("security: InitCerts needs a directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Paths{}, fmt.Errorf("security: %w", err)
	}
	files := []struct {
		path string
		mode fs.FileMode
		data func(*PKI) []byte
	}{
		{p.CA, 0o644, func(k *PKI) []byte { return k.CAPEM }},
		{p.CAKey, 0o600, func(k *PKI) []byte { return k.caKeyPEM }},
		{p.ServerCert, 0o644, func(k *PKI) []byte { return k.serverPEM }},
		{p.ServerKey, 0o600, func(k *PKI) []byte { return k.serverKeyPEM }},
		{p.WorkerCert, 0o644, func(k *PKI) []byte { return k.workerPEM }},
		{p.WorkerKey, 0o600, func(k *PKI) []byte { return k.workerKeyPEM }},
		{p.Token, 0o600, func(k *PKI) []byte { return []byte(k.Token + "\n") }},
	}
	if !opt.Force {
		var exist []string
		for _, f := range files {
			if _, err := os.Lstat(f.path); err == nil {
				exist = append(exist, filepath.Base(f.path))
			}
		}
		if len(exist) > 0 {
			return Paths{}, fmt.Errorf("security: %s already holds %s; use force to overwrite: %w",
				dir, strings.Join(exist, ", "), fs.ErrExist)
		}
	}
	k, err := newPKI(opt)
	if err != nil {
		return Paths{}, err
	}
	for _, f := range files {
		if err := writeFileAtomic(f.path, f.data(k), f.mode, opt.Force); err != nil {
			return Paths{}, err
		}
	}
	return p, nil
}

// writeFileAtomic writes data to a temporary file in path's directory with
// mode, syncs it, and moves it to path: by rename when overwrite is
// allowed, by link (which fails if path exists) when it is not.
func writeFileAtomic(path string, data []byte, mode fs.FileMode, overwrite bool) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("security: %w", err)
	}
	name := tmp.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(name)
		}
	}()
	if err = tmp.Chmod(mode); err == nil {
		if _, err = tmp.Write(data); err == nil {
			err = tmp.Sync()
		}
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("security: writing %s: %w", path, err)
	}
	if overwrite {
		if err = os.Rename(name, path); err != nil {
			return fmt.Errorf("security: %w", err)
		}
	} else {
		if err = os.Link(name, path); err != nil {
			return fmt.Errorf("security: refusing to overwrite %s: %w", path, err)
		}
		_ = os.Remove(name)
	}
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

func newPKI(opt CertOptions) (*PKI, error) {
	hosts := opt.Hosts
	if len(hosts) == 0 {
		hosts = DefaultHosts()
	}
	workerHosts := opt.WorkerHosts
	if len(workerHosts) == 0 {
		workerHosts = hosts
	}
	validity := opt.Validity
	if validity <= 0 {
		validity = DefaultValidity
	}
	now := time.Now().Add(-5 * time.Minute) // tolerate small clock skew

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("security: %w", err)
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{Organization: []string{"gradsync"}, CommonName: "gradsync development CA"},
		NotBefore:             now,
		NotAfter:              now.Add(2 * validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := sign(caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("security: %w", err)
	}
	k := &PKI{CA: ca, caKey: caKey, Pool: x509.NewCertPool()}
	k.Pool.AddCert(ca)
	k.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	if k.caKeyPEM, err = keyPEM(caKey); err != nil {
		return nil, err
	}
	if k.Server, k.serverPEM, k.serverKeyPEM, err = k.issue("gradsync server", ServerRoleURI, hosts, now, validity); err != nil {
		return nil, err
	}
	if k.Worker, k.workerPEM, k.workerKeyPEM, err = k.issue("gradsync worker", WorkerRoleURI, workerHosts, now, validity); err != nil {
		return nil, err
	}
	if k.Token, err = NewToken(); err != nil {
		return nil, err
	}
	return k, nil
}

// issue signs a leaf certificate usable for both server and client
// authentication, carrying role as a URI SAN and hosts as DNS/IP SANs.
func (k *PKI) issue(cn, role string, hosts []string, now time.Time, validity time.Duration) (tls.Certificate, []byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, nil, fmt.Errorf("security: %w", err)
	}
	u, err := url.Parse(role)
	if err != nil {
		return tls.Certificate{}, nil, nil, fmt.Errorf("security: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{Organization: []string{"gradsync"}, CommonName: cn},
		NotBefore:   now,
		NotAfter:    now.Add(validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{u},
	}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if ip := net.ParseIP(strings.Trim(h, "[]")); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := sign(tmpl, k.CA, &key.PublicKey, k.caKey)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	kp, err := keyPEM(key)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, kp)
	if err != nil {
		return tls.Certificate{}, nil, nil, fmt.Errorf("security: %w", err)
	}
	return pair, certPEM, kp, nil
}

func sign(tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, priv *ecdsa.PrivateKey) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("security: %w", err)
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, priv)
	if err != nil {
		return nil, fmt.Errorf("security: signing %q: %w", tmpl.Subject.CommonName, err)
	}
	return der, nil
}

func keyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("security: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ServerTLS is the TLS configuration of the coordinator's server: the
// server certificate, client certificates verified if given.
func (k *PKI) ServerTLS() *tls.Config {
	return serverConfig(k.Server, k.Pool, tls.VerifyClientCertIfGiven)
}

// WorkerServerTLS is the configuration of a worker's peer (Collective)
// endpoint: the worker certificate, a client certificate required.
func (k *PKI) WorkerServerTLS() *tls.Config {
	return serverConfig(k.Worker, k.Pool, tls.RequireAndVerifyClientCert)
}

// ClientTLS is the configuration of an API client: trusts the CA, presents
// no certificate (it authenticates with the token).
func (k *PKI) ClientTLS() *tls.Config { return clientConfig(k.Pool, nil) }

// WorkerClientTLS is the configuration a worker dials the coordinator
// with: trusts the CA and presents the worker certificate.
func (k *PKI) WorkerClientTLS() *tls.Config { return clientConfig(k.Pool, &k.Worker) }

// PeerClientTLS is the configuration a worker dials its peers with: see
// the package function PeerClientTLS.
func (k *PKI) PeerClientTLS() *tls.Config { return peerClientConfig(k.Pool, &k.Worker) }

// Credentials wraps a tls.Config as gRPC transport credentials.
func Credentials(c *tls.Config) credentials.TransportCredentials { return credentials.NewTLS(c) }

// Tokens are the accepted client tokens (just Token), for AuthOptions.
func (k *PKI) Tokens() [][]byte { return [][]byte{[]byte(k.Token)} }
