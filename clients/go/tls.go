package gcmoe

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"google.golang.org/grpc/credentials"
)

// TLSFiles names the PEM files of a TLS connection to a gcmoe service.
type TLSFiles struct {
	// CAFile holds the certificates of the CA that signed the server's certificate; "" trusts
	// the system's roots.
	CAFile string
	// CertFile and KeyFile are the client's certificate chain and private key, for a service
	// that requires client certificates (server.tls.client_ca); both or neither.
	CertFile string
	KeyFile  string
	// ServerName is the name the server's certificate is checked against when it is not the
	// host of the address (a certificate for "gcmoe.internal" reached at an IP address).
	ServerName string
}

// TLSCredentials reads the files now (so a missing or malformed one fails here, not at the
// first call) and returns the transport credentials for Options.Credentials.
func TLSCredentials(files TLSFiles) (credentials.TransportCredentials, error) {
	config := &tls.Config{ServerName: files.ServerName, MinVersion: tls.VersionTLS12}
	if files.CAFile != "" {
		pem, err := os.ReadFile(files.CAFile)
		if err != nil {
			return nil, fmt.Errorf("gcmoe: TLSFiles.CAFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("gcmoe: TLSFiles.CAFile: %s holds no PEM certificate", files.CAFile)
		}
		config.RootCAs = pool
	}
	if (files.CertFile == "") != (files.KeyFile == "") {
		return nil, errors.New("gcmoe: TLSFiles.CertFile and KeyFile go together (the client certificate for mTLS)")
	}
	if files.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(files.CertFile, files.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("gcmoe: TLSFiles.CertFile and KeyFile: %w", err)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(config), nil
}
