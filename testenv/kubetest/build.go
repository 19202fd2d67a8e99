package kubetest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"
)

// BinaryEnv names a kube-apiserver binary to use instead of building one.
const BinaryEnv = "NODEAGENT_KUBE_APISERVER"

// CacheEnv names the directory built binaries are kept in (default
// /var/cache/nodeagent-kube, or the user cache dir when not root).
const CacheEnv = "NODEAGENT_KUBE_CACHE"

// toolModule is the module, relative to the repository root, that builds
// kube-apiserver from k8s.io/kubernetes.
const toolModule = "testenv/kubeapiserver"

// Binary returns the path of a kube-apiserver built from the tool module,
// building it first if the cache has none for the module's current go.mod,
// go.sum and main.go. A cold build takes minutes (the Go build cache makes
// later ones fast); logf, when set, is told before one starts. Concurrent
// callers, in this process or others, build once.
func Binary(logf func(format string, args ...any)) (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		return p, nil
	}
	src, err := moduleDir()
	if err != nil {
		return "", err
	}
	key, err := sourceKey(src)
	if err != nil {
		return "", err
	}
	dir, err := cacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "kube-apiserver-"+key)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}

	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("kube-apiserver cache %s: %w", dir, err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock kube-apiserver cache %s: %w", dir, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil // another process built it while we waited
	}

	goBin, err := goTool()
	if err != nil {
		return "", err
	}
	if logf != nil {
		logf("building kube-apiserver from %s into %s (minutes when the Go build cache is cold)", src, bin)
	}
	start := time.Now()
	tmp := bin + ".tmp"
	// -s -w: no symbol table or DWARF, which shortens the link of a
	// 140 MB binary; nobody debugs the test server.
	cmd := exec.Command(goBin, "build", "-ldflags=-s -w", "-o", tmp, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("build kube-apiserver in %s: %w\n%s", src, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("build kube-apiserver: %w", err)
	}
	if logf != nil {
		logf("built kube-apiserver in %s", time.Since(start).Round(time.Second))
	}
	return bin, nil
}

// moduleDir finds the tool module: beside this file's package in the
// source tree, or above the working directory (tests run in their
// package's directory).
func moduleDir() (string, error) {
	var tried []string
	if _, file, _, ok := runtime.Caller(0); ok {
		d := filepath.Join(filepath.Dir(file), "..", "kubeapiserver")
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Clean(d), nil
		}
		tried = append(tried, d)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find %s: %w", toolModule, err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		m := filepath.Join(d, toolModule)
		if _, err := os.Stat(filepath.Join(m, "go.mod")); err == nil {
			return m, nil
		}
		tried = append(tried, m)
		if filepath.Dir(d) == d {
			break
		}
	}
	return "", fmt.Errorf("find %s: not at %v", toolModule, tried)
}

// sourceKey hashes what decides the binary: the tool module's files and
// the Go version building it.
func sourceKey(src string) (string, error) {
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", fmt.Errorf("kube-apiserver source: %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	goBin, err := goTool()
	if err != nil {
		return "", err
	}
	v, err := exec.Command(goBin, "env", "GOVERSION").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOVERSION: %w", err)
	}
	h.Write(v)
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func cacheDir() (string, error) {
	dir := os.Getenv(CacheEnv)
	if dir == "" {
		dir = "/var/cache/nodeagent-kube"
		if os.Geteuid() != 0 {
			uc, err := os.UserCacheDir()
			if err != nil {
				return "", fmt.Errorf("kube-apiserver cache: %w", err)
			}
			dir = filepath.Join(uc, "nodeagent-kube")
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("kube-apiserver cache: %w", err)
	}
	return dir, nil
}

// goTool finds the go command: on PATH, else the usual install.
func goTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/local/go/bin/go", "/usr/lib/go/bin/go"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no go command to build kube-apiserver with (PATH or /usr/local/go/bin)")
}
