// Command node-setup prepares what the test node needs besides its programs, with no tools
// from the host (the GPU test host may lack iproute2 and openssl):
//
//	node-setup net NODE_IP/PREFIX SERVICE_IP   in the node's fresh network namespace: lo up,
//	                                           with both addresses
//	node-setup pki DIR NODE NODE_IP SERVICE_IP a CA and the certificates of the cluster's
//	                                           components, and the service-account key pair
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "node-setup:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	switch {
	case len(args) == 3 && args[0] == "net":
		return setupNet(args[1], args[2])
	case len(args) == 5 && args[0] == "pki":
		return setupPKI(args[1], args[2], net.ParseIP(args[3]), net.ParseIP(args[4]))
	}

	return fmt.Errorf("usage: node-setup net NODE_IP/PREFIX SERVICE_IP | pki DIR NODE NODE_IP SERVICE_IP")
}

// setupNet puts both addresses on lo: a dummy interface needs a kernel option that some
// VM kernels lack, and addresses on lo are local all the same (pods reach them through their
// bridge gateway); the kubelet refuses only loopback addresses (127/8), not lo.
func setupNet(nodeCIDR, serviceIP string) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("finding lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("setting lo up: %w", err)
	}

	for _, a := range []string{nodeCIDR, serviceIP + "/32"} {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return fmt.Errorf("address %s: %w", a, err)
		}
		if err := netlink.AddrAdd(lo, addr); err != nil {
			return fmt.Errorf("adding %s to lo: %w", a, err)
		}
	}

	return nil
}

// identity is one certificate: its subject and, for servers, its names.
type identity struct {
	file, cn, org string
	dns           []string
	ips           []net.IP
}

func setupPKI(dir, node string, nodeIP, serviceIP net.IP) error {
	if nodeIP == nil || serviceIP == nil {
		return fmt.Errorf("pki: NODE_IP and SERVICE_IP must be IP addresses")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := template(pkix.Name{CommonName: "k8s-node-ca"})
	caTmpl.IsCA, caTmpl.BasicConstraintsValid = true, true
	caTmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("creating the CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writeCert(dir, "ca", caDER, caKey); err != nil {
		return err
	}

	for _, id := range []identity{
		{file: "apiserver", cn: "kube-apiserver",
			dns: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
			ips: []net.IP{net.IPv4(127, 0, 0, 1), nodeIP, serviceIP}},
		{file: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", org: "system:masters"},
		{file: "admin", cn: "admin", org: "system:masters"},
		{file: "kubelet", cn: "system:node:" + node, org: "system:nodes"},
		{file: "controller-manager", cn: "system:kube-controller-manager"},
		{file: "scheduler", cn: "system:kube-scheduler"},
	} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		name := pkix.Name{CommonName: id.cn}
		if id.org != "" {
			name.Organization = []string{id.org}
		}
		tmpl := template(name)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		tmpl.DNSNames, tmpl.IPAddresses = id.dns, id.ips
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("creating %s: %w", id.file, err)
		}
		if err := writeCert(dir, id.file, der, key); err != nil {
			return err
		}
	}

	// The service-account token signing key: RSA, as kube-apiserver's docs use.
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)); err != nil {
		return err
	}

	return writePEM(filepath.Join(dir, "sa.pub"), "PUBLIC KEY", pub)
}

func template(name pkix.Name) *x509.Certificate {
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62)) //nolint:errcheck // crypto/rand does not fail
	now := time.Now()

	return &x509.Certificate{SerialNumber: serial, Subject: name, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(48 * time.Hour)}
}

func writeCert(dir, name string, der []byte, key *ecdsa.PrivateKey) error {
	k, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, name+".key"), "EC PRIVATE KEY", k); err != nil {
		return err
	}

	return writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", der)
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}
