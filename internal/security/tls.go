package security

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// ServerTLS loads the configuration of a gradsync server (the coordinator,
// or anything serving public and worker RPCs on one port): TLS 1.3 at
// least, the given certificate, and — when caFile is not empty — client
// certificates verified against that CA if the client presents one
// (tls.VerifyClientCertIfGiven). API clients come with a token and no
// certificate; workers come with a worker certificate; the Authorizer
// decides per RPC. With caFile empty no client certificate is asked for,
// so no caller can prove the worker role.
func ServerTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	cert, err := loadPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	if caFile == "" {
		return serverConfig(cert, nil, tls.NoClientCert), nil
	}
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	return serverConfig(cert, pool, tls.VerifyClientCertIfGiven), nil
}

// PeerServerTLS loads the configuration of a worker's peer-to-peer
// (Collective) endpoint: like ServerTLS, but a client certificate signed by
// the CA is required (tls.RequireAndVerifyClientCert), so a caller without
// one cannot complete the handshake. caFile is required.
func PeerServerTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, errors.New("security: a peer endpoint needs a CA file to verify peer certificates")
	}
	cert, err := loadPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	return serverConfig(cert, pool, tls.RequireAndVerifyClientCert), nil
}

// ClientTLS loads a client configuration: the server is verified against
// caFile (empty: the system roots) and by host name; certFile and keyFile,
// both or neither, are the certificate the client presents (a worker's;
// API clients present none and send a token instead).
func ClientTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	var pool *x509.CertPool
	if caFile != "" {
		p, err := loadPool(caFile)
		if err != nil {
			return nil, err
		}
		pool = p
	}
	cert, err := optionalPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return clientConfig(pool, cert), nil
}

// PeerClientTLS loads the configuration a worker dials another worker's
// peer endpoint with. Workers reach each other by whatever address the
// coordinator hands out, which need not be in the peer's certificate, so
// the peer is verified by chain (against caFile) and by role (its
// certificate must carry WorkerRoleURI) instead of by host name. The
// worker certificate is presented, as PeerServerTLS requires.
func PeerClientTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, errors.New("security: a peer client needs a CA file to verify peers")
	}
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	cert, err := loadPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return peerClientConfig(pool, &cert), nil
}

func serverConfig(cert tls.Certificate, pool *x509.CertPool, auth tls.ClientAuthType) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   auth,
		NextProtos:   []string{"h2"},
	}
}

func clientConfig(pool *x509.CertPool, cert *tls.Certificate) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, NextProtos: []string{"h2"}}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}

func peerClientConfig(pool *x509.CertPool, cert *tls.Certificate) *tls.Config {
	c := clientConfig(pool, cert)
	// Host-name verification is replaced, not dropped: VerifyConnection
	// verifies the chain against pool and requires the worker role.
	c.InsecureSkipVerify = true
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("security: peer presented no certificate")
		}
		inter := x509.NewCertPool()
		for _, ic := range cs.PeerCertificates[1:] {
			inter.AddCert(ic)
		}
		leaf := cs.PeerCertificates[0]
		if _, err := leaf.Verify(x509.VerifyOptions{
			Roots:         pool,
			Intermediates: inter,
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}); err != nil {
			return fmt.Errorf("security: peer certificate: %w", err)
		}
		if !HasRole(leaf, WorkerRoleURI) {
			return fmt.Errorf("security: peer certificate %q lacks the worker role (%s)", leaf.Subject.CommonName, WorkerRoleURI)
		}
		return nil
	}
	return c
}

// HasRole reports whether cert carries role as a URI SAN.
func HasRole(cert *x509.Certificate, role string) bool {
	if cert == nil {
		return false
	}
	for _, u := range cert.URIs {
		if u.String() == role {
			return true
		}
	}
	return false
}

func loadPair(certFile, keyFile string) (tls.Certificate, error) {
	if certFile == "" || keyFile == "" {
		return tls.Certificate{}, errors.New("security: a certificate file and a key file are both required")
	}
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("security: loading %s / %s: %w", certFile, keyFile, err)
	}
	return c, nil
}

func optionalPair(certFile, keyFile string) (*tls.Certificate, error) {
	switch {
	case certFile == "" && keyFile == "":
		return nil, nil
	case certFile == "" || keyFile == "":
		return nil, errors.New("security: give both a client certificate and its key, or neither")
	}
	c, err := loadPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

func loadPool(caFile string) (*x509.CertPool, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("security: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("security: %s holds no PEM certificate", caFile)
	}
	return pool, nil
}
