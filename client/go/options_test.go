package moebatch

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moebatch/client/go/internal/testserver"
)

func TestTimeoutResolution(t *testing.T) {
	cases := map[time.Duration]time.Duration{0: DefaultTimeout, -1: 0, 5 * time.Second: 5 * time.Second}
	for in, want := range cases {
		o := Options{Timeout: in}
		if got := o.timeout(); got != want {
			t.Errorf("timeout(%v) = %v, want %v", in, got, want)
		}
	}
}

func TestDefaultServerAddr(t *testing.T) {
	t.Setenv(ServerEnv, "")
	if DefaultServerAddr() != "127.0.0.1:50051" {
		t.Errorf("default %q", DefaultServerAddr())
	}
	t.Setenv(ServerEnv, "daemon:7000")
	if DefaultServerAddr() != "daemon:7000" {
		t.Errorf("from env %q", DefaultServerAddr())
	}
}

func TestBearerToken(t *testing.T) {
	b := bearerToken{token: "s3cret"}
	md, err := b.GetRequestMetadata(context.Background())
	if err != nil || len(md) != 1 || md["authorization"] != "Bearer s3cret" {
		t.Errorf("metadata %v, %v", md, err)
	}
	if b.RequireTransportSecurity() {
		t.Error("the token must work over plaintext too")
	}
	for _, bad := range []string{" lead", "trail ", "new\nline", "tab\there", "é"} {
		if _, err := Dial("127.0.0.1:1", Options{Token: bad}); err == nil || !strings.HasPrefix(err.Error(), "token: ") {
			t.Errorf("token %q: %v", bad, err)
		}
	}
	c, err := Dial("127.0.0.1:1", Options{Token: "abc.DEF-123_~+/="})
	if err != nil {
		t.Fatalf("a valid token was refused: %v", err)
	}
	c.Close()
}

func TestTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	certs, err := testserver.NewCerts(dir)
	if err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		opts TLSOptions
		want string
	}{
		{TLSOptions{CAFile: filepath.Join(dir, "nope.pem")}, "TLS CA file: open "},
		{TLSOptions{CAFile: notPEM}, "no PEM certificate in it"},
		{TLSOptions{CertFile: certs.ClientCertFile}, "needs its key file too"},
		{TLSOptions{KeyFile: certs.ClientKeyFile}, "needs its certificate file too"},
		{TLSOptions{CertFile: certs.ClientCertFile, KeyFile: certs.ServerKeyFile}, "TLS client certificate"},
	}
	for _, c := range cases {
		_, err := c.opts.Config()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one containing %q", c.opts, err, c.want)
		}
		// Dial reports the same, before any connection.
		if _, err := Dial("127.0.0.1:1", Options{TLS: &c.opts}); err == nil {
			t.Errorf("Dial accepted %+v", c.opts)
		}
	}
	cfg, err := (&TLSOptions{CAFile: certs.CAFile, CertFile: certs.ClientCertFile,
		KeyFile: certs.ClientKeyFile, ServerName: "localhost"}).Config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RootCAs == nil || len(cfg.Certificates) != 1 || cfg.ServerName != "localhost" {
		t.Errorf("config %+v", cfg)
	}
}
