// Package kubetest runs a real kube-apiserver and etcd for the Kubernetes
// test tier: kube-apiserver built from k8s.io/kubernetes by the tool module
// testenv/kubeapiserver, etcd from Debian's etcd-server. The server
// authorizes with Node,RBAC and admits with NodeRestriction, as k3s does,
// so a client with a node identity (CN=system:node:<name>, O=system:nodes)
// is confined to its own Node exactly as on a real node.
//
// A Server is set up by New (certificates, ports, kubeconfigs) before it is
// started, so a test can hand out kubeconfigs of a server that is not up
// yet and start it later.
package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// RequiredEnv, set to 1, turns the skips of Require into failures; CI=true
// does the same, so CI cannot pass by skipping this tier.
const RequiredEnv = "NODEAGENT_KUBE_REQUIRED"

// Require skips the test when the tier cannot run here: under -short, or
// without etcd or a go command. In CI it fails instead.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the kube-apiserver tier is skipped (make test runs it)")
	}
	required := os.Getenv(RequiredEnv) == "1" || os.Getenv("CI") == "true"
	miss := func(format string, args ...any) {
		t.Helper()
		if required {
			t.Fatalf(format+" (required in CI)", args...)
		}
		t.Skipf(format, args...)
	}
	if _, err := exec.LookPath("etcd"); err != nil {
		miss("no etcd on PATH: apt-get install etcd-server (.ci/run does)")
	}
	if os.Getenv(BinaryEnv) == "" {
		if _, err := goTool(); err != nil {
			miss("%v", err)
		}
	}
}

// Server is one etcd plus kube-apiserver on loopback ports.
type Server struct {
	dir string
	// URL is the API server's https URL.
	URL string
	pki *pki

	apiPort, etcdPort, peerPort int

	// Admin is a client in system:masters.
	Admin       kubernetes.Interface
	AdminConfig *rest.Config

	mu       sync.Mutex
	etcd     *exec.Cmd
	etcdDone chan struct{}
	api      *exec.Cmd
	apiDone  chan struct{}
}

// New sets up a server in dir: certificates, ports, an admin client. It
// does not start anything.
func New(dir string) (*Server, error) {
	s := &Server{dir: dir}
	p, err := newPKI(filepath.Join(dir, "pki"))
	if err != nil {
		return nil, err
	}
	s.pki = p
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	s.apiPort, s.etcdPort, s.peerPort = ports[0], ports[1], ports[2]
	s.URL = "https://127.0.0.1:" + strconv.Itoa(s.apiPort)
	s.AdminConfig, err = s.Config("admin", "system:masters")
	if err != nil {
		return nil, err
	}
	s.Admin, err = kubernetes.NewForConfig(s.AdminConfig)
	if err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	return s, nil
}

// Start runs a server for t and stops it when t ends; it skips or fails as
// Require does.
func Start(t testing.TB) *Server {
	t.Helper()
	Require(t)
	s, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := s.Start(ctx, t.Logf); err != nil {
		t.Fatal(err)
	}
	return s
}

// Config returns a client config with a certificate for user cn in groups.
func (s *Server) Config(cn string, groups ...string) (*rest.Config, error) {
	cert, key, err := s.pki.clientCert(cn, groups)
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host:            s.URL,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.pki.caPEM, CertData: cert, KeyData: key},
		Timeout:         10 * time.Second,
	}, nil
}

// NodeConfig returns a client config with node name's identity,
// system:node:<name> in system:nodes, as the kubelet has.
func (s *Server) NodeConfig(name string) (*rest.Config, error) {
	return s.Config("system:node:"+name, "system:nodes")
}

// WriteNodeKubeconfig writes a kubeconfig file with node name's identity to
// path, shaped like the k3s kubelet's.
func (s *Server) WriteNodeKubeconfig(path, name string) error {
	rc, err := s.NodeConfig(name)
	if err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	kc.AuthInfos["node"] = &clientcmdapi.AuthInfo{ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData}
	kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "node"}
	kc.CurrentContext = "local"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("kubeconfig for node %s: %w", name, err)
	}
	return nil
}

// CreateNode creates a Node object named name, as an admin, the way the
// kubelet's registration would.
func (s *Server) CreateNode(ctx context.Context, name string, labels map[string]string) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := s.Admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{FieldManager: "kubelet"}); err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	return nil
}

// Start runs etcd and kube-apiserver (building it if need be) and waits
// until the API server is ready. A stopped server starts again with its
// data. logf, when set, hears about a build.
func (s *Server) Start(ctx context.Context, logf func(string, ...any)) error {
	bin, err := Binary(logf)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.api != nil {
		return errors.New("kube-apiserver already running")
	}
	if s.etcd, s.etcdDone, err = s.run("etcd", "etcd",
		"--name=default",
		"--data-dir="+filepath.Join(s.dir, "etcd"),
		"--listen-client-urls="+s.etcdURL(),
		"--advertise-client-urls="+s.etcdURL(),
		"--listen-peer-urls="+s.peerURL(),
		"--initial-advertise-peer-urls="+s.peerURL(),
		"--initial-cluster=default="+s.peerURL(),
	); err != nil {
		return err
	}
	if err := s.startAPILocked(bin); err != nil {
		s.stopLocked()
		return err
	}
	if err := s.waitReady(ctx); err != nil {
		s.stopLocked()
		return err
	}
	return nil
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, etcd
// having run on, and waits until it is ready.
func (s *Server) StartAPIServer(ctx context.Context) error {
	bin, err := Binary(nil)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.etcd == nil:
		return errors.New("etcd is not running")
	case s.api != nil:
		return errors.New("kube-apiserver already running")
	}
	if err := s.startAPILocked(bin); err != nil {
		return err
	}
	if err := s.waitReady(ctx); err != nil {
		stop(s.api, s.apiDone)
		s.api, s.apiDone = nil, nil
		return err
	}
	return nil
}

// startAPILocked starts the kube-apiserver process.
func (s *Server) startAPILocked(bin string) error {
	p := s.pki
	var err error
	s.api, s.apiDone, err = s.run("kube-apiserver", bin,
		"--etcd-servers="+s.etcdURL(),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(s.apiPort),
		"--cert-dir="+filepath.Join(s.dir, "apiserver-certs"),
		"--tls-cert-file="+p.file("serving.crt"),
		"--tls-private-key-file="+p.file("serving.key"),
		"--client-ca-file="+p.file("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p.file("sa.pub"),
		"--service-account-signing-key-file="+p.file("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		// Less to start: no endpoint lease loop, no flow control.
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	)
	return err
}

// Stop stops kube-apiserver and etcd. The data stays for another Start.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

// StopAPIServer stops kube-apiserver only: clients see connection refused.
func (s *Server) StopAPIServer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	stop(s.api, s.apiDone)
	s.api, s.apiDone = nil, nil
}

func (s *Server) stopLocked() {
	stop(s.api, s.apiDone)
	s.api, s.apiDone = nil, nil
	stop(s.etcd, s.etcdDone)
	s.etcd, s.etcdDone = nil, nil
}

// stop ends cmd's process group, gently first.
func stop(cmd *exec.Cmd, done chan struct{}) {
	if cmd == nil {
		return
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-done:
		return
	case <-time.After(10 * time.Second):
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

func (s *Server) etcdURL() string { return "http://127.0.0.1:" + strconv.Itoa(s.etcdPort) }
func (s *Server) peerURL() string { return "http://127.0.0.1:" + strconv.Itoa(s.peerPort) }

// LogTail returns the end of a component's log ("etcd" or
// "kube-apiserver"), for a failing test to print.
func (s *Server) LogTail(name string, n int) string {
	b, _ := os.ReadFile(filepath.Join(s.dir, name+".log"))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// run starts a component in its own process group with its output in
// dir/<name>.log; done closes when it exits.
func (s *Server) run(name, bin string, args ...string) (*exec.Cmd, chan struct{}, error) {
	log, err := os.OpenFile(filepath.Join(s.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, nil, fmt.Errorf("start %s: %w", name, err)
	}
	// Below the programs under test: a (re)starting kube-apiserver takes
	// every core for seconds, and on a small machine the daemon's
	// userspace WireGuard would wait for it. Its threads inherit this.
	syscall.Setpriority(syscall.PRIO_PROCESS, cmd.Process.Pid, 10)
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		log.Close()
		close(done)
	}()
	return cmd, done, nil
}

// waitReady polls /readyz until it answers ok, the server exits, or ctx
// ends.
func (s *Server) waitReady(ctx context.Context) error {
	start := time.Now()
	var last error
	for {
		select {
		case <-s.apiDone:
			return fmt.Errorf("kube-apiserver exited while starting:\n%s", s.LogTail("kube-apiserver", 30))
		case <-s.etcdDone:
			return fmt.Errorf("etcd exited while starting:\n%s", s.LogTail("etcd", 30))
		default:
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var code int
		body, err := s.Admin.Discovery().RESTClient().Get().AbsPath("/readyz").Do(rctx).StatusCode(&code).Raw()
		cancel()
		if err == nil && code == http.StatusOK && bytes.Equal(bytes.TrimSpace(body), []byte("ok")) {
			return s.waitRBAC(ctx)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready after %s: %v\n%s", time.Since(start).Round(time.Second), last, s.LogTail("kube-apiserver", 30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitRBAC waits until the bootstrap ClusterRole for nodes exists, so the
// first node request is not refused for a role still being created.
func (s *Server) waitRBAC(ctx context.Context) error {
	for {
		_, err := s.Admin.RbacV1().ClusterRoles().Get(ctx, "system:node", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("kube-apiserver: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver: bootstrap roles: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// freePorts returns n loopback TCP ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
