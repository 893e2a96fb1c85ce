package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gradsync/gradsync/internal/rpc"
	"github.com/gradsync/gradsync/internal/security"
)

// secFlags say how a process secures its connections: a certificate folder
// written by `gradsync certs init`, or plaintext asked for explicitly.
type secFlags struct {
	certs    string
	insecure bool
	token    string
}

func (f *secFlags) register(c *cobra.Command) {
	pf := c.PersistentFlags()
	pf.StringVar(&f.certs, "certs", os.Getenv("GRADSYNC_CERTS"), "folder written by 'gradsync certs init' (env GRADSYNC_CERTS)")
	pf.BoolVar(&f.insecure, "insecure", false, "plaintext gRPC: no TLS, no certificates (only on a trusted network)")
	pf.StringVar(&f.token, "token", "", "bearer token for the jobs API (default $GRADSYNC_TOKEN, else <certs>/token)")
}

var errNoSecurity = errors.New("no TLS configured: give --certs DIR (create one with 'gradsync certs init') or ask for plaintext with --insecure")

func (f *secFlags) path(name string) string { return filepath.Join(f.certs, name) }

// server returns the coordinator's TLS configuration and accepted tokens.
func (f *secFlags) server() (*tls.Config, [][]byte, error) {
	if f.insecure {
		toks, err := security.LoadTokens("", security.TokenEnv)
		return nil, toks, err
	}
	if f.certs == "" {
		return nil, nil, errNoSecurity
	}
	cfg, err := security.ServerTLS(f.path(security.ServerCertFile), f.path(security.ServerKeyFile), f.path(security.CAFile))
	if err != nil {
		return nil, nil, err
	}
	toks, err := security.LoadTokens(f.path(security.TokenFile), security.TokenEnv)
	return cfg, toks, err
}

// worker returns a worker's TLS configurations: to the coordinator, for its
// peer endpoint, and to its peers.
func (f *secFlags) worker() (client, peerServer, peerClient *tls.Config, err error) {
	if f.insecure {
		return nil, nil, nil, nil
	}
	if f.certs == "" {
		return nil, nil, nil, errNoSecurity
	}
	ca, cert, key := f.path(security.CAFile), f.path(security.WorkerCertFile), f.path(security.WorkerKeyFile)
	if client, err = security.ClientTLS(ca, cert, key); err != nil {
		return
	}
	if peerServer, err = security.PeerServerTLS(cert, key, ca); err != nil {
		return
	}
	peerClient, err = security.PeerClientTLS(ca, cert, key)
	return
}

// clientToken finds the API token: --token, $GRADSYNC_TOKEN, <certs>/token.
func (f *secFlags) clientToken() (string, error) {
	if f.token != "" {
		return f.token, nil
	}
	if t := os.Getenv(security.TokenEnv); t != "" {
		return t, nil
	}
	if f.certs == "" {
		return "", nil
	}
	b, err := os.ReadFile(f.path(security.TokenFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]), nil
}

// clientDialOptions are the transport options of an API client.
func (f *secFlags) clientDialOptions() ([]grpc.DialOption, error) {
	tok, err := f.clientToken()
	if err != nil {
		return nil, err
	}
	if f.insecure {
		opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if tok != "" {
			opts = append(opts, grpc.WithPerRPCCredentials(security.TokenCredentials(tok, false)))
		}
		return opts, nil
	}
	if f.certs == "" {
		return nil, errNoSecurity
	}
	cfg, err := security.ClientTLS(f.path(security.CAFile), "", "")
	if err != nil {
		return nil, err
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}
	if tok != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(security.TokenCredentials(tok, true)))
	}
	return opts, nil
}

// dial opens a client connection to addr (grpc.NewClient: no blocking dial).
func dial(addr string, opts []grpc.DialOption) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(addr, append(rpc.DialOptions(), opts...)...)
	if err != nil {
		return nil, fmt.Errorf("server address %q: %w", addr, err)
	}
	return conn, nil
}

// dialServer connects an API client to the coordinator named by --server.
func (g *globals) dialServer() (*grpc.ClientConn, error) {
	opts, err := g.sec.clientDialOptions()
	if err != nil {
		return nil, err
	}
	return dial(g.server, opts)
}

func newCertsCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "certs", Short: "Certificates and tokens for TLS/mTLS"}
	var opt security.CertOptions
	var dir string
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Create a development CA, server and worker certificates, and an API token",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			paths, err := security.InitCerts(dir, opt)
			if err != nil {
				return err
			}
			p := &printer{out: c.OutOrStdout(), json: g.json}
			if g.json {
				p.jsonLine(certsLineOf(paths))
				return nil
			}
			fmt.Fprintf(c.OutOrStdout(), `wrote %s: CA (%s), server (%s), worker (%s), API token (%s)
  server:  gradsync server --certs %[1]s
  workers: gradsync worker --certs %[1]s --server HOST:7070   (copy ca.pem, worker.pem, worker-key.pem)
  clients: gradsync jobs --certs %[1]s --server HOST:7070     (copy ca.pem and token)
`, paths.Dir, filepath.Base(paths.CA), filepath.Base(paths.ServerCert), filepath.Base(paths.WorkerCert), filepath.Base(paths.Token))
			return nil
		},
	}
	initCmd.Flags().StringVar(&dir, "dir", "certs", "folder to write into")
	initCmd.Flags().StringSliceVar(&opt.Hosts, "hosts", nil, "names and IPs for the server certificate (default: localhost, 127.0.0.1, ::1, this host)")
	initCmd.Flags().BoolVar(&opt.Force, "force", false, "overwrite existing files")
	c.AddCommand(initCmd)
	return c
}
