package security

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc/credentials"
)

// TokenEnv is the environment variable clients and servers read a token
// from.
const TokenEnv = "GRADSYNC_TOKEN"

// MinTokenLen is the shortest token LoadTokens accepts.
const MinTokenLen = 16

// NewToken returns a fresh random client token: 32 bytes from
// crypto/rand, base64url without padding (43 characters).
func NewToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("security: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// LoadTokens reads accepted client tokens from file (one per line; blank
// lines and lines starting with # are skipped; empty: no file) and from the
// environment variable envName (one token; empty name: not read — pass
// TokenEnv for GRADSYNC_TOKEN). Duplicates are dropped. No file and an
// unset variable give no tokens and no error; a named file without a token,
// or a token shorter than MinTokenLen or containing white space, is an
// error.
func LoadTokens(fileOrEmpty string, envName string) ([][]byte, error) {
	var out [][]byte
	add := func(tok, where string) error {
		if len(tok) < MinTokenLen {
			return fmt.Errorf("security: token in %s is %d characters; at least %d are required", where, len(tok), MinTokenLen)
		}
		if strings.ContainsAny(tok, " \t\r\n") {
			return fmt.Errorf("security: token in %s contains white space", where)
		}
		for _, t := range out {
			if bytes.Equal(t, []byte(tok)) {
				return nil
			}
		}
		out = append(out, []byte(tok))
		return nil
	}
	if fileOrEmpty != "" {
		f, err := os.Open(fileOrEmpty)
		if err != nil {
			return nil, fmt.Errorf("security: %w", err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		n, line := 0, 0
		for sc.Scan() {
			line++
			t := strings.TrimSpace(sc.Text())
			if t == "" || strings.HasPrefix(t, "#") {
				continue
			}
			if err := add(t, fmt.Sprintf("%s line %d", fileOrEmpty, line)); err != nil {
				return nil, err
			}
			n++
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("security: reading %s: %w", fileOrEmpty, err)
		}
		if n == 0 {
			return nil, fmt.Errorf("security: %s holds no token", fileOrEmpty)
		}
	}
	if envName != "" {
		if t := strings.TrimSpace(os.Getenv(envName)); t != "" {
			if err := add(t, "$"+envName); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// TokenCredentials are per-RPC credentials sending
// "authorization: bearer <token>". With requireTLS, gRPC refuses to send
// them over a connection without transport security (use false only with
// an explicitly insecure, plaintext connection).
func TokenCredentials(token string, requireTLS bool) credentials.PerRPCCredentials {
	return tokenCreds{md: map[string]string{"authorization": "bearer " + token}, tls: requireTLS}
}

type tokenCreds struct {
	md  map[string]string
	tls bool
}

func (c tokenCreds) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	if c.tls {
		if ri, ok := credentials.RequestInfoFromContext(ctx); ok {
			if err := credentials.CheckSecurityLevel(ri.AuthInfo, credentials.PrivacyAndIntegrity); err != nil {
				return nil, errors.New("security: refusing to send the token over a connection without TLS")
			}
		}
	}
	return c.md, nil
}

func (c tokenCreds) RequireTransportSecurity() bool { return c.tls }
