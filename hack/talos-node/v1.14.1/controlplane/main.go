// Command controlplane makes what a Kubernetes control plane on the host needs to take a Talos
// v1.14.1 worker (hack/talos-node/controlplane.sh), from the secrets bundle that `talosctl gen
// secrets` wrote and `talosctl gen config --with-secrets` puts in the worker's machine config:
//
//	controlplane pki -secrets FILE -out DIR -address IP -server URL
//	    the API server's certificates, as Talos's KubernetesDynamicCertsController makes them
//	    (internal/app/machined/pkg/controllers/secrets/kubernetes_dynamic_certs.go), signed by
//	    the bundle's Kubernetes CA; its service account key; an admin kubeconfig for URL; the
//	    bundle's bootstrap token (DIR/bootstrap-token, "ID.SECRET")
//	controlplane trustd-state -secrets FILE -address IP -socket PATH
//	    serves, on the unix socket PATH, the two resources Talos's trustd reads from machined
//	    (internal/app/machined/pkg/system/services/trustd.go: secrets.OSRoot "os" and
//	    secrets.Trustd "trustd"), as TrustdController makes them on a control plane node
//	    (controllers/secrets/trustd.go, root.go), so that Talos's own trustd (machined started
//	    as "trustd") signs the worker's apid certificate
//
// IP is the address the worker reaches this machine at (qemu's user network: 10.0.2.2).
package main

import (
	"context"
	stdx509 "crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/cosi-project/runtime/pkg/state/protobuf/server"
	"github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	secretsres "github.com/siderolabs/talos/pkg/machinery/resources/secrets"
	"google.golang.org/grpc"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: controlplane pki|trustd-state [flags]")
	}

	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	secretsPath := fs.String("secrets", "", "the secrets bundle (talosctl gen secrets)")
	address := fs.String("address", "10.0.2.2", "the address the worker reaches this machine at")
	out := fs.String("out", "", "pki: the directory to write to")
	serverURL := fs.String("server", "", "pki: the API server's URL for the admin kubeconfig")
	socket := fs.String("socket", "", "trustd-state: the unix socket to serve on")

	if err := fs.Parse(args[1:]); err != nil {
		return err
	}

	bundle, err := secrets.LoadBundle(*secretsPath)
	if err != nil {
		return fmt.Errorf("loading the secrets bundle %q: %w", *secretsPath, err)
	}

	ip, err := netip.ParseAddr(*address)
	if err != nil {
		return fmt.Errorf("-address: %w", err)
	}

	switch args[0] {
	case "pki":
		if *out == "" || *serverURL == "" {
			return errors.New("pki: -out and -server are required")
		}

		return writePKI(bundle, ip, *out, *serverURL)
	case "trustd-state":
		if *socket == "" {
			return errors.New("trustd-state: -socket is required")
		}

		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()

		return serveTrustdState(ctx, bundle, ip, *socket)
	default:
		return fmt.Errorf("unknown command %q (want pki or trustd-state)", args[0])
	}
}

// certificateValidity is Talos's for the Kubernetes certificates
// (controllers/secrets/kubernetes_dynamic_certs.go KubernetesCertificateValidityDuration).
const certificateValidity = 365 * 24 * time.Hour

func writePKI(bundle *secrets.Bundle, ip netip.Addr, out, serverURL string) error {
	ca, err := x509.NewCertificateAuthorityFromCertificateAndKey(bundle.Certs.K8s)
	if err != nil {
		return fmt.Errorf("the bundle's Kubernetes CA: %w", err)
	}

	// The API server's SANs: the worker's way to it (IP), this machine's loopback (kubectl),
	// and the names and service address every API server answers to (Talos's
	// KubernetesCertSANsController, controllers/secrets/kubernetes_cert_sans.go).
	apiServer, err := x509.NewKeyPair(ca,
		x509.IPAddresses([]net.IP{ip.AsSlice(), net.IPv4(127, 0, 0, 1), net.IPv4(10, 96, 0, 1)}),
		x509.DNSNames([]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"}),
		x509.CommonName("kube-apiserver"),
		x509.Organization("kube-master"),
		x509.NotAfter(time.Now().Add(certificateValidity)),
		x509.KeyUsage(stdx509.KeyUsageDigitalSignature|stdx509.KeyUsageKeyEncipherment),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}),
	)
	if err != nil {
		return fmt.Errorf("the API server's certificate: %w", err)
	}

	// The API server's client certificate to kubelets, and the admin's: both system:masters
	// (Talos: constants.KubernetesAdminCertOrganization).
	client := func(cn string) (*x509.KeyPair, error) {
		return x509.NewKeyPair(ca,
			x509.CommonName(cn),
			x509.Organization("system:masters"),
			x509.NotAfter(time.Now().Add(certificateValidity)),
			x509.KeyUsage(stdx509.KeyUsageDigitalSignature|stdx509.KeyUsageKeyEncipherment),
			x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth}),
		)
	}

	kubeletClient, err := client("apiserver-kubelet-client")
	if err != nil {
		return fmt.Errorf("the API server's kubelet client certificate: %w", err)
	}

	admin, err := client("admin")
	if err != nil {
		return fmt.Errorf("the admin certificate: %w", err)
	}

	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: host
  cluster:
    server: %s
    certificate-authority: ca.crt
users:
- name: admin
  user:
    client-certificate: admin.crt
    client-key: admin.key
contexts:
- name: admin@host
  context: {cluster: host, user: admin}
current-context: admin@host
`, serverURL)

	files := map[string][]byte{
		"ca.crt":                       bundle.Certs.K8s.Crt,
		"ca.key":                       bundle.Certs.K8s.Key,
		"apiserver.crt":                apiServer.CrtPEM,
		"apiserver.key":                apiServer.KeyPEM,
		"apiserver-kubelet-client.crt": kubeletClient.CrtPEM,
		"apiserver-kubelet-client.key": kubeletClient.KeyPEM,
		"admin.crt":                    admin.CrtPEM,
		"admin.key":                    admin.KeyPEM,
		"service-account.key":          bundle.Certs.K8sServiceAccount.Key,
		"bootstrap-token":              []byte(bundle.Secrets.BootstrapToken + "\n"),
		"kubeconfig":                   []byte(kubeconfig),
	}

	if err := os.MkdirAll(out, 0o700); err != nil {
		return err
	}

	for name, data := range files {
		if err := os.WriteFile(filepath.Join(out, name), data, 0o600); err != nil {
			return err
		}
	}

	return nil
}

func serveTrustdState(ctx context.Context, bundle *secrets.Bundle, ip netip.Addr, socket string) error {
	ca, err := x509.NewCertificateAuthorityFromCertificateAndKey(bundle.Certs.OS)
	if err != nil {
		return fmt.Errorf("the bundle's OS CA: %w", err)
	}

	accepted := []*x509.PEMEncodedCertificate{{Crt: bundle.Certs.OS.Crt}}

	// trustd's server certificate, as TrustdController makes it for a control plane node:
	// the worker dials trustd at the address the `kubernetes` EndpointSlice names (IP).
	serverCert, err := x509.NewKeyPair(ca,
		x509.IPAddresses([]net.IP{ip.AsSlice()}),
		x509.CommonName("trustd"),
		x509.NotAfter(time.Now().Add(x509.DefaultCertificateValidityDuration)),
		x509.KeyUsage(stdx509.KeyUsageDigitalSignature|stdx509.KeyUsageKeyEncipherment),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}),
	)
	if err != nil {
		return fmt.Errorf("trustd's certificate: %w", err)
	}

	st := state.WrapCore(namespaced.NewState(inmem.Build))

	osRoot := secretsres.NewOSRoot(secretsres.OSRootID)
	*osRoot.TypedSpec() = secretsres.OSRootSpec{
		IssuingCA:   bundle.Certs.OS,
		AcceptedCAs: accepted,
		CertSANIPs:  []netip.Addr{ip},
		Token:       bundle.TrustdInfo.Token,
	}

	trustd := secretsres.NewTrustd()
	*trustd.TypedSpec() = secretsres.TrustdCertsSpec{
		AcceptedCAs: accepted,
		Server:      x509.NewCertificateAndKeyFromKeyPair(serverCert),
	}

	for _, r := range []resource.Resource{osRoot, trustd} {
		if err := st.Create(ctx, r); err != nil {
			return fmt.Errorf("creating %s: %w", r.Metadata().Type(), err)
		}
	}

	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}

	listener, err := (&net.ListenConfig{}).Listen(ctx, "unix", socket)
	if err != nil {
		return err
	}

	srv := grpc.NewServer()
	v1alpha1.RegisterStateServer(srv, server.NewState(st))

	go func() {
		<-ctx.Done()
		srv.Stop()
	}()

	fmt.Fprintf(os.Stderr, "controlplane: serving trustd's state on %s\n", socket)

	return srv.Serve(listener)
}
