// Command wgfloor runs one wireguard-go device and nothing else: the
// userspace WireGuard that nodeagent embeds, configured once through its
// own UAPI from a file of set= lines, up, and idle until SIGTERM. The idle
// benchmark runs it beside the daemon with the same peers, so the memory
// the embedded device needs by itself is measured in the same run as the
// daemon's.
//
//	wgfloor -name wgf0 -conf peers.uapi
//
// It prints "ready" on stdout once the device is configured and up.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
)

func main() {
	name := flag.String("name", "", "the TUN device to create")
	conf := flag.String("conf", "", "a file of UAPI set= lines (private_key=..., public_key=..., allowed_ip=...)")
	gc := flag.Int("gc", 50, "the garbage collector's target percent (the daemon's is 50)")
	flag.Parse()
	if *name == "" || *conf == "" {
		fmt.Fprintln(os.Stderr, "usage: wgfloor -name DEV -conf FILE")
		os.Exit(2)
	}
	debug.SetGCPercent(*gc)
	f, err := os.Open(*conf)
	if err != nil {
		fail(err)
	}
	t, err := tun.CreateTUN(*name, device.DefaultMTU)
	if err != nil {
		fail(err)
	}
	dev := device.NewDevice(t, conn.NewDefaultBind(), device.NewLogger(device.LogLevelSilent, ""))
	if err := dev.IpcSetOperation(f); err != nil {
		fail(err)
	}
	f.Close()
	if err := dev.Up(); err != nil {
		fail(err)
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	dev.Close()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "wgfloor:", err)
	os.Exit(1)
}
