# nodeagent — see README.md. `make test` runs every test tier and prints one
# summary; `make test-unit` is the quick loop.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c

# sudo's secure_path drops /usr/local/go/bin, where go.dev's tarball puts Go:
# look there when PATH has no go, and let what the tests run find it too.
GO      ?= $(shell command -v go || echo /usr/local/go/bin/go)
export PATH := $(PATH):/usr/local/go/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
LOGDIR  := .cache/test
# Packages whose tests run in the VM too: the VLAN tests need 8021q and dummy,
# the WireGuard tests the kernel module, the daemon's drift tests cover VLANs
# and kernel WireGuard there, and the routing and nftables scenarios are
# worth proving on Debian's own kernel. The CLI's WireGuard
# test and the PIA kill -9/restart test (a kernel device must keep its
# ifindex and session) run there too (VM_CMD_TESTS), by themselves: the other
# CLI tests read the source tree. TestSameNodePods is the seeds' topology
# with a real 8021q VLAN there (pods attached by Debian's macvlan CNI plugin).
# Each package's tests get 20 minutes in the VM: under TCG the agent's take
# about ten (every drift repair, PIA and safe-apply test with a real daemon).
VM_PKGS ?= ./netcfg/link ./netcfg ./netcfg/nft ./netcfg/wg ./netcfg/importer ./agent
VM_CMD_TESTS ?= TestApplyOnceWireGuard|TestPIAKillNineAndRestart|TestSameNodePods
VMTEST  := $(GO) run ./testenv/cmd/vmtest

.PHONY: deps deps-demo build test test-unit test-vm test-deb deb man bench fuzz lint demo clean soak soak-break

build:
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o bin/nodeagent ./cmd/nodeagent
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o bin/nodeagentctl ./cmd/nodeagentctl

# Every tier that exists: unit + host-kernel netns (as root, with the VM
# runner's own smoke test) and the VM tier,
# then one summary over both logs. The trixie and sid roots the newer
# download clients run from (testenv/debroot) are built first, once per
# machine (cached under /var/cache/nodeagent-roots), outside any test's
# timeout, while the kube-apiserver builds (mostly downloads beside a
# compile).
test: deps
	@mkdir -p $(LOGDIR); status=0; \
	$(GO) run ./testenv/cmd/debroots > $(LOGDIR)/debroots.log 2>&1 & roots=$$!; \
	$(GO) run ./testenv/cmd/kubeapiserver || status=1; \
	wait $$roots || { status=1; cat $(LOGDIR)/debroots.log; }; \
	NODEAGENT_VM_SMOKE=1 NODEAGENT_DEB_VM=1 $(GO) test -count=1 -timeout 45m -v ./... 2>&1 | tee $(LOGDIR)/host.log || status=1; \
	$(VMTEST) -timeout 20m $(VM_PKGS) 2>&1 | tee $(LOGDIR)/vm.log || status=1; \
	$(VMTEST) -run '$(VM_CMD_TESTS)' ./cmd/nodeagent 2>&1 | tee $(LOGDIR)/vm-cmd.log || status=1; \
	$(GO) run ./testenv/cmd/testsum $(LOGDIR)/host.log $(LOGDIR)/vm.log $(LOGDIR)/vm-cmd.log || status=1; \
	exit $$status

# The .deb: dist/nodeagent_<version>_amd64.deb (nfpm, from packaging/tools).
deb:
	GO=$(GO) packaging/build-deb.sh dist

# The package tier alone (also part of `make test`, as TestDebInSystemdVM in
# host.log): build the .deb, lintian, then install, start, reload, kill,
# wedge and purge it in a Debian VM running systemd.
test-deb:
	NODEAGENT_DEB_VM=1 $(GO) test -count=1 -v -run TestDebInSystemdVM ./packaging

# Regenerate docs/*.8 and docs/nodeagent.yaml.5 from the code (usage texts,
# config schema); TestGeneratedManPages fails until they are committed.
man:
	$(GO) run ./packaging/genman -o docs

# Unit tests only: no root, no VM.
test-unit:
	$(GO) test -count=1 -short ./...

test-vm:
	@mkdir -p $(LOGDIR); status=0; \
	$(VMTEST) -timeout 20m $(VM_PKGS) 2>&1 | tee $(LOGDIR)/vm.log || status=1; \
	$(VMTEST) -run '$(VM_CMD_TESTS)' ./cmd/nodeagent 2>&1 | tee $(LOGDIR)/vm-cmd.log || status=1; \
	$(GO) run ./testenv/cmd/testsum $(LOGDIR)/vm.log $(LOGDIR)/vm-cmd.log || status=1; \
	exit $$status

# Benchmarks with their baselines side by side: rules, routes and nftables in a host
# netns (and the no-op sync of 1000 links), VLANs inside the VM (they need 8021q),
# 5000 WireGuard peers (register onto a fresh device, one file changed, the drift
# poll with -benchmem, the combined no-op of 1000 VLANs + 1000 rules + 1000 routes +
# nftables + 5000 peers beside the kernel's dump floor), and the idle daemon's CPU
# and memory over 60 s (userspace WireGuard on the host, the kernel's in the VM).
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x ./netcfg/route ./netcfg/nft ./netcfg/link
	$(GO) test -run '^$$' -bench 'NoopSync(Homelab|1000Macvlans)' -benchtime 500x ./netcfg
	$(VMTEST) -bench 'Converge|Register|Messages' -benchtime 1x -run '^$$' ./netcfg/link ./netcfg/wg
	$(GO) test -run '^$$' -bench WGPoll -benchmem ./netcfg/wg
	$(VMTEST) -bench WGPoll -benchmem -run '^$$' ./netcfg/wg
	$(VMTEST) -bench NoopSync1000x1000x5000 -benchtime 1x -run '^$$' ./netcfg
	$(GO) test -run '^$$' -bench IdleDaemon -benchtime 1x ./cmd/nodeagent
	$(VMTEST) -bench IdleDaemon -benchtime 1x -run '^$$' ./cmd/nodeagent
	$(GO) test -run '^$$' -bench PIA -benchtime 3x ./agent
	$(VMTEST) -bench PIA -benchtime 3x -run '^$$' ./agent

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 60s ./netcfg/config

lint:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

clean:
	rm -rf bin dist $(LOGDIR)

# A lab in network namespaces running the real agent; never touches the host.
# The Debian packages the tests (or the demo) need, installed when missing.
deps:
	./testenv/deps.sh test

deps-demo:
	./testenv/deps.sh demo

# The lab of the seeds' homelab in network namespaces, run by the real
# daemon, each step checked (DEMOFLAGS=--step pauses between steps).
demo: deps-demo build
	$(GO) build -o bin/demo ./testenv/demo
	bin/demo --nodeagent bin/nodeagent $(DEMOFLAGS)

# Faults at random against the homelab with every invariant checked the
# whole time (testenv/soak): SOAK is how long the nemesis runs (CI's
# TestSoak runs 5 minutes of it), SEED replays a run's faults.
SOAK ?= 5m
SEED ?= 0
soak: deps build
	$(GO) run ./testenv/cmd/soak --duration $(SOAK) --seed $(SEED) --nodeagent bin/nodeagent --logdir .cache/soak

# The proof that the soak can fail: a daemon built broken on purpose
# (-tags soakbreak: it makes a deleted nft table again without its kill
# switch) must fail it, naming the invariant and the seed.
soak-break: deps build
	CGO_ENABLED=0 $(GO) build -tags soakbreak -o bin/nodeagent-soakbreak ./cmd/nodeagent
	@$(GO) run ./testenv/cmd/soak --duration 5m --seed $(SEED) --nodeagent bin/nodeagent-soakbreak --logdir .cache/soak-break --stop-on-violation; \
	status=$$?; if [ $$status -eq 1 ]; then echo "soak-break: the broken daemon failed the soak, as it must"; else echo "soak-break: exit $$status, want 1"; exit 1; fi
