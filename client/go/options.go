package moebatch

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

const (
	// DefaultServer is the daemon's address when neither an address nor $MOEBATCH_SERVER is
	// given.
	DefaultServer = "127.0.0.1:50051"
	// DefaultTimeout is the deadline of each unary call when Options.Timeout is 0.
	DefaultTimeout = 60 * time.Second
	// ServerEnv names the environment variable with the daemon's address (as in the Python
	// client).
	ServerEnv = "MOEBATCH_SERVER"
	// TokenEnv names the environment variable with the bearer token.
	TokenEnv = "MOEBATCH_TOKEN"
	// maxReceiveBytes bounds one received message; results and job pages are small, but a large
	// job's page should not fail (the Python client allows the same).
	maxReceiveBytes = 64 << 20
)

// DefaultServerAddr is $MOEBATCH_SERVER, or DefaultServer when that is unset or empty.
func DefaultServerAddr() string {
	if addr := os.Getenv(ServerEnv); addr != "" {
		return addr
	}
	return DefaultServer
}

// Options configure a Client. The zero value connects in plaintext without a token and gives
// each unary call DefaultTimeout.
type Options struct {
	// Timeout is the deadline of each unary call (CreateJob, GetJob, ListJobs, CancelJob); 0
	// means DefaultTimeout and a negative value none. Streams (WatchJob, GetResults, WaitJob)
	// get no deadline from it: a job may run for hours; bound them with their context.
	Timeout time.Duration
	// Token, when not empty, is sent with every call as the metadata
	// "authorization: Bearer <Token>", over TLS and over plaintext alike.
	Token string
	// TLS, when not nil, connects over TLS; nil connects in plaintext.
	TLS *TLSOptions
	// DialOptions are appended to the client's own (transport credentials, the token, message
	// size limits), e.g. grpc.WithBlock() or a custom dialer.
	DialOptions []grpc.DialOption
}

// TLSOptions configure a TLS connection to the daemon.
type TLSOptions struct {
	// CAFile is a PEM file with the certificate(s) that signed the server's certificate; empty
	// means the system's roots.
	CAFile string
	// CertFile and KeyFile are the client's PEM certificate and private key, for a server that
	// requires client certificates (mutual TLS); both or neither.
	CertFile string
	KeyFile  string
	// ServerName overrides the name checked against the server's certificate (by default the
	// host part of the address).
	ServerName string
}

// Config builds the crypto/tls configuration: the CA pool, the client certificate, the server
// name. Errors name the file that could not be used.
func (t *TLSOptions) Config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("TLS CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS CA file %s: no PEM certificate in it", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("TLS client certificate %s / key %s: %w", t.CertFile, t.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case t.CertFile != "":
		return nil, errors.New("TLS: a client certificate needs its key file too")
	case t.KeyFile != "":
		return nil, errors.New("TLS: a client key needs its certificate file too")
	}
	return cfg, nil
}

// bearerToken is a per-RPC credential that adds "authorization: Bearer <token>" to every call.
// It does not require transport security, so it also works over plaintext (loopback, or a
// trusted network in front of the daemon).
type bearerToken struct {
	token string
}

// GetRequestMetadata returns the authorization header.
func (b bearerToken) GetRequestMetadata(ctx context.Context, uri ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false: the token is sent over plaintext connections too.
func (b bearerToken) RequireTransportSecurity() bool {
	return false
}

// checkToken refuses tokens that cannot travel in an HTTP/2 header value.
func checkToken(token string) error {
	if strings.TrimSpace(token) != token {
		return errors.New("token: must not start or end with white space")
	}
	for _, r := range token {
		if r < 0x20 || r > 0x7e {
			return fmt.Errorf("token: must be printable ASCII, found %q", r)
		}
	}
	return nil
}

// dialOptions turns Options into grpc dial options.
func (o *Options) dialOptions() ([]grpc.DialOption, error) {
	opts := []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxReceiveBytes)),
	}
	if o.TLS != nil {
		cfg, err := o.TLS.Config()
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	} else {
		opts = append(opts, grpc.WithInsecure())
	}
	if o.Token != "" {
		if err := checkToken(o.Token); err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearerToken{token: o.Token}))
	}
	return append(opts, o.DialOptions...), nil
}

// timeout resolves Options.Timeout: 0 = DefaultTimeout, negative = none (0 returned).
func (o *Options) timeout() time.Duration {
	switch {
	case o.Timeout == 0:
		return DefaultTimeout
	case o.Timeout < 0:
		return 0
	}
	return o.Timeout
}
