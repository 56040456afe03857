package main

import (
	"context"
	stdx509 "crypto/x509"
	"encoding/pem"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/protobuf/client"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	secretsres "github.com/siderolabs/talos/pkg/machinery/resources/secrets"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

var workerIP = netip.MustParseAddr("10.0.2.2")

func newBundle(t *testing.T) *secrets.Bundle {
	t.Helper()

	bundle, err := secrets.NewBundle(secrets.NewClock(), config.TalosVersionCurrent)
	if err != nil {
		t.Fatal(err)
	}

	return bundle
}

func parseCert(t *testing.T, data []byte) *stdx509.Certificate {
	t.Helper()

	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("no PEM block in %q", data)
	}

	crt, err := stdx509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}

	return crt
}

func pool(t *testing.T, caPEM []byte) *stdx509.CertPool {
	t.Helper()

	p := stdx509.NewCertPool()
	if !p.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate")
	}

	return p
}

// The API server's certificate must verify, for every name a client reaches it by, against
// the Kubernetes CA in the bundle the worker's machine config carries (its kubelet's only
// trust), and the two client certificates must be system:masters' for client auth.
func TestPKIIsTheBundlesKubernetesCA(t *testing.T) {
	bundle := newBundle(t)
	out := t.TempDir()

	if err := writePKI(bundle, workerIP, out, "https://127.0.0.1:6443"); err != nil {
		t.Fatal(err)
	}

	read := func(name string) []byte {
		data, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}

		return data
	}

	roots := pool(t, bundle.Certs.K8s.Crt)
	apiServer := parseCert(t, read("apiserver.crt"))

	for _, name := range []string{"10.0.2.2", "127.0.0.1", "localhost", "kubernetes.default.svc"} {
		if _, err := apiServer.Verify(stdx509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
			t.Errorf("the API server's certificate for %s: %v", name, err)
		}
	}

	for _, name := range []string{"apiserver-kubelet-client.crt", "admin.crt"} {
		crt := parseCert(t, read(name))
		if _, err := crt.Verify(stdx509.VerifyOptions{Roots: roots, KeyUsages: []stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s: %v", name, err)
		}

		if got := crt.Subject.Organization; len(got) != 1 || got[0] != "system:masters" {
			t.Errorf("%s: organization %v, want [system:masters]", name, got)
		}
	}

	if got := strings.TrimSpace(string(read("bootstrap-token"))); got != bundle.Secrets.BootstrapToken {
		t.Errorf("bootstrap-token %q, want the bundle's %q", got, bundle.Secrets.BootstrapToken)
	}

	if !strings.Contains(string(read("kubeconfig")), "server: https://127.0.0.1:6443\n") {
		t.Errorf("the kubeconfig does not name the server:\n%s", read("kubeconfig"))
	}
}

// trustd reads its two resources through the socket as Talos's trustd does
// (internal/app/trustd/main.go: a COSI state client on the runtime socket): the OS root
// with the bundle's token, and a server certificate that the worker's remote generator,
// which trusts the bundle's OS CA, accepts at the worker's address for the host.
func TestTrustdStateServesWhatTrustdReads(t *testing.T) {
	bundle := newBundle(t)
	socket := filepath.Join(t.TempDir(), "runtime.sock")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	served := make(chan error, 1)

	go func() { served <- serveTrustdState(ctx, bundle, workerIP, socket) }()

	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close() //nolint:errcheck

	st := state.WrapCore(client.NewAdapter(v1alpha1.NewStateClient(conn)))

	var osRoot *secretsres.OSRoot

	for deadline := time.Now().Add(10 * time.Second); ; {
		osRoot, err = safe.StateGet[*secretsres.OSRoot](ctx, st, resource.NewMetadata(secretsres.NamespaceName, secretsres.OSRootType, secretsres.OSRootID, resource.VersionUndefined))
		if err == nil || time.Now().After(deadline) {
			break
		}

		time.Sleep(100 * time.Millisecond)
	}

	if err != nil {
		t.Fatalf("reading the OS root: %v", err)
	}

	if osRoot.TypedSpec().Token != bundle.TrustdInfo.Token {
		t.Errorf("token %q, want the bundle's %q", osRoot.TypedSpec().Token, bundle.TrustdInfo.Token)
	}

	trustd, err := safe.StateGet[*secretsres.Trustd](ctx, st, resource.NewMetadata(secretsres.NamespaceName, secretsres.TrustdType, secretsres.TrustdID, resource.VersionUndefined))
	if err != nil {
		t.Fatalf("reading trustd's certificates: %v", err)
	}

	crt := parseCert(t, trustd.TypedSpec().Server.Crt)
	if _, err := crt.Verify(stdx509.VerifyOptions{Roots: pool(t, bundle.Certs.OS.Crt)}); err != nil {
		t.Errorf("trustd's certificate against the OS CA: %v", err)
	}

	if err := crt.VerifyHostname(workerIP.String()); err != nil {
		t.Errorf("trustd's certificate for %s: %v", workerIP, err)
	}

	cancel()

	select {
	case err := <-served:
		if err != nil && !isClosed(err) {
			t.Errorf("serving: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the server did not stop with its context")
	}
}

func isClosed(err error) bool {
	return err == grpc.ErrServerStopped || strings.Contains(err.Error(), net.ErrClosed.Error())
}
