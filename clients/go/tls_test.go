package gcmoe

// Against a real `gcmoe serve` on TLS with client certificates required and a tokens file, the
// certificates made here with crypto/x509: Forward through TLSCredentials and a Token gives the
// C++ client's bytes; a missing or wrong token is UNAUTHENTICATED with the server's message; no
// client certificate, plaintext or a wrong server name cannot connect; and a Token without TLS
// is refused by Dial.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// testPKI is a CA, a server certificate for 127.0.0.1 and localhost and a client certificate
// it signed, and a tokens file, as PEM files in dir.
type testPKI struct {
	dir, token string
}

func (p testPKI) path(name string) string { return filepath.Join(p.dir, name) }

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// issue writes name.crt and name.key: a P-256 key and a certificate from template, signed by
// parent (self-signed when parent is nil).
func issue(t *testing.T, dir, name string, template *x509.Certificate, parent *x509.Certificate,
	parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = template, key
	}
	der, err := x509.CreateCertificate(rand.Reader, template, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, name+".crt"), "CERTIFICATE", der)
	writePEM(t, filepath.Join(dir, name+".key"), "PRIVATE KEY", keyDER)
	return cert, key
}

func makePKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	template := func(serial int64, name string) *x509.Certificate {
		return &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(48 * time.Hour)}
	}
	caTemplate := template(1, "gcmoe-go-test-ca")
	caTemplate.IsCA, caTemplate.BasicConstraintsValid = true, true
	caTemplate.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	ca, caKey := issue(t, dir, "ca", caTemplate, nil, nil)
	for i, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		name := []string{"server", "client"}[i]
		leaf := template(int64(2+i), name)
		leaf.KeyUsage = x509.KeyUsageDigitalSignature
		leaf.ExtKeyUsage = []x509.ExtKeyUsage{usage}
		leaf.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		leaf.DNSNames = []string{"localhost"}
		issue(t, dir, name, leaf, ca, caKey)
	}
	p := testPKI{dir: dir, token: "go-test-token-0123456789"}
	if err := os.WriteFile(p.path("tokens"), []byte("# the test's token\n"+p.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func dialTLS(t *testing.T, addr string, files TLSFiles, token string) *Client {
	t.Helper()
	creds, err := TLSCredentials(files)
	if err != nil {
		t.Fatal(err)
	}
	client, err := Dial(context.Background(), addr, Options{Credentials: creds, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func TestTLSAndTokenAgainstARealService(t *testing.T) {
	p := makePKI(t)
	s := startServe(t, "--set", "server.tls.cert="+p.path("server.crt"),
		"--set", "server.tls.key="+p.path("server.key"),
		"--set", "server.tls.client_ca="+p.path("ca.crt"),
		"--set", "server.auth.tokens_file="+p.path("tokens"))
	files := TLSFiles{CAFile: p.path("ca.crt"), CertFile: p.path("client.crt"), KeyFile: p.path("client.key")}
	client := dialTLS(t, s.addr, files, p.token)
	waitServing(t, client) // grpc.health.v1 answers without a token
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	info, err := client.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	H, E, k := int(info.GetHidden()), int(info.GetExperts()), int(info.GetTopK())
	const T, layer = 16, 1
	hidden, routing := request(T, H, E, k, 13)
	dir := saveRequest(t, hidden, Shape{T, H}, routing)
	cppTLS := []string{"--tls-ca", files.CAFile, "--tls-cert", files.CertFile, "--tls-key",
		files.KeyFile, "--token-file", p.path("tokens")}

	t.Run("Forward over TLS with the token gives the C++ client's bytes", func(t *testing.T) {
		out, err := client.ForwardFloat32(ctx, layer, hidden, Shape{T, H}, routing, ForwardOptions{OutputFP32: true})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Data, cppForward(t, s, dir, "fp32", "fp32", layer, cppTLS...)) {
			t.Fatal("the Go and C++ clients got different outputs over TLS for the same request")
		}
		named := files
		named.ServerName = "localhost" // a name the certificate carries, not the address's IP
		again, err := dialTLS(t, s.addr, named, p.token).ForwardFloat32(ctx, layer, hidden, Shape{T, H},
			routing, ForwardOptions{OutputFP32: true})
		if err != nil || !bytes.Equal(again.Data, out.Data) {
			t.Fatalf("through ServerName %q: %v, or different bytes", named.ServerName, err)
		}
	})
	t.Run("a missing or wrong token is UNAUTHENTICATED with the server's message", func(t *testing.T) {
		for _, c := range []struct{ token, words string }{
			{"", `no "authorization: Bearer TOKEN" metadata`},
			{"not-" + p.token, "not one of server.auth.tokens_file's"},
		} {
			other := dialTLS(t, s.addr, files, c.token)
			_, err := other.Info(ctx)
			if !IsCode(err, codes.Unauthenticated) || !strings.Contains(err.Error(), c.words) {
				t.Errorf("Info with token %q: got %v, expected UNAUTHENTICATED saying %q", c.token, err, c.words)
			}
			_, err = other.ForwardFloat32(ctx, layer, hidden, Shape{T, H}, routing, ForwardOptions{})
			if !IsCode(err, codes.Unauthenticated) || !strings.Contains(err.Error(), c.words) {
				t.Errorf("Forward with token %q: got %v, expected UNAUTHENTICATED saying %q", c.token, err, c.words)
			}
			stream, err := other.ForwardStream(ctx)
			if err == nil {
				_, err = stream.ForwardFloat32(layer, hidden, Shape{T, H}, routing, ForwardOptions{})
				stream.Close()
			}
			if !IsCode(err, codes.Unauthenticated) || !strings.Contains(err.Error(), c.words) {
				t.Errorf("ForwardStream with token %q: got %v, expected UNAUTHENTICATED saying %q", c.token, err, c.words)
			}
		}
	})
	t.Run("without the client certificate, the CA or the right name there is no connection", func(t *testing.T) {
		noCert := TLSFiles{CAFile: files.CAFile}
		misnamed := files
		misnamed.ServerName = "gcmoe.example"
		systemRoots := TLSFiles{CertFile: files.CertFile, KeyFile: files.KeyFile}
		for what, f := range map[string]TLSFiles{"no client certificate": noCert,
			"a server name the certificate lacks": misnamed, "the system's roots": systemRoots} {
			short, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := dialTLS(t, s.addr, f, p.token).Info(short)
			cancel()
			if !IsCode(err, codes.Unavailable) && !IsCode(err, codes.DeadlineExceeded) {
				t.Errorf("%s: got %v, expected no connection (UNAVAILABLE)", what, err)
			}
		}
		plain, err := Dial(ctx, s.addr, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer plain.Close()
		short, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := plain.Info(short); !IsCode(err, codes.Unavailable) && !IsCode(err, codes.DeadlineExceeded) {
			t.Errorf("plaintext to a TLS port: got %v, expected no connection", err)
		}
	})
}

func TestTLSOptionsRefuseWhatCannotWork(t *testing.T) {
	p := makePKI(t)
	for _, addr := range []string{"192.0.2.1:50051", "dns:///gcmoe.example:50051", "[2001:db8::1]:1"} {
		if _, err := Dial(context.Background(), addr, Options{Token: p.token}); err == nil ||
			!strings.Contains(err.Error(), "Options.Token needs TLS Options.Credentials") {
			t.Errorf("a token on a plaintext connection to %s: got %v, expected Dial to refuse it",
				addr, err)
		}
	}
	// Loopback and Unix sockets may: Dial accepts, and a call fails only for want of a server.
	for _, addr := range []string{"127.0.0.1:1", "127.8.9.10:1", "localhost:1", "[::1]:1",
		"unix:/nonexistent/gcmoe.sock"} {
		c, err := Dial(context.Background(), addr, Options{Token: p.token})
		if err != nil {
			t.Errorf("a token on plaintext to %s: Dial refused it: %v", addr, err)
			continue
		}
		short, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if _, err := c.Info(short); !IsCode(err, codes.Unavailable) &&
			!IsCode(err, codes.DeadlineExceeded) {
			t.Errorf("a token on plaintext to %s: got %v, expected no connection", addr, err)
		}
		cancel()
		c.Close()
	}
	for _, c := range []struct {
		files TLSFiles
		words string
	}{
		{TLSFiles{CertFile: p.path("client.crt")}, "CertFile and KeyFile go together"},
		{TLSFiles{CAFile: p.path("ca.key")}, "holds no PEM certificate"},
		{TLSFiles{CAFile: p.path("missing.crt")}, "no such file"},
		{TLSFiles{CertFile: p.path("client.crt"), KeyFile: p.path("server.key")}, "does not match"},
	} {
		if _, err := TLSCredentials(c.files); err == nil || !strings.Contains(err.Error(), c.words) {
			t.Errorf("TLSCredentials(%+v): got %v, expected an error saying %q", c.files, err, c.words)
		}
	}
}
