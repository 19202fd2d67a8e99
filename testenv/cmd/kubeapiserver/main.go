// Command kubeapiserver builds the test tier's kube-apiserver into its
// cache (testenv/kubetest.Binary) and prints its path. make test runs it
// before the tests, so a cold build (minutes) does not count against a
// test binary's timeout.
package main

import (
	"fmt"
	"log"
	"os"

	"github.com/nodeagent/nodeagent/testenv/kubetest"
)

func main() {
	log.SetFlags(0)
	bin, err := kubetest.Binary(func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(bin)
}
