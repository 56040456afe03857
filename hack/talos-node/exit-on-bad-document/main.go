// Command exit-on-bad-document gives the service back a defect that the real Talos node's
// checks must catch (hack/talos-node/control.sh, TALOS_NODE_CONTROL=exit): a service that exits
// when its configuration is invalid, which under Talos's `restart: always` is a crash loop.
// control.sh puts it in a copy of the extension in place of the service binary, which it
// renames to <binary>.real; it runs that, passing its output and signals through, and exits 1
// as soon as the service reports an invalid configuration. It is never part of the product.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
)

// invalid is the service's report of a bad document (service/main.go).
const invalid = "configuration is invalid"

func main() {
	os.Exit(run())
}

func run() int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "exit-on-bad-document:", err)

		return 1
	}

	cmd := exec.Command(self+".real", os.Args[1:]...)
	cmd.Stdin = os.Stdin
	cmd.Stdout = os.Stdout

	stderr, err := cmd.StderrPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "exit-on-bad-document:", err)

		return 1
	}

	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "exit-on-bad-document:", err)

		return 1
	}

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)

	go func() {
		for sig := range signals {
			_ = cmd.Process.Signal(sig)
		}
	}()

	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		fmt.Fprintln(os.Stderr, lines.Text())

		if strings.Contains(lines.Text(), invalid) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()

			return 1
		}
	}

	if err := cmd.Wait(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}

		return 1
	}

	return 0
}
