// Package stopsignal makes a stop signal that comes before the service handles it end the
// service with exit 0. Imported for that effect alone (service/main.go); it has no API.
//
// Talos stops an extension service with SIGTERM to the service's PID 1 (its own PID
// namespace), and the kernel drops a signal whose action is the default one for the init of
// a PID namespace. Before the Go runtime installs its handlers, a SIGTERM was so lost (Talos
// then SIGKILLs after 10 s); after, and until main registers with os/signal (runtime start
// and package initialization: tens of milliseconds, NVIDIA's libraries and semver's regular
// expressions among them), the runtime ends the process by re-raising the signal with the
// default action, which a PID 1 survives, and then exits 2 (issue 32: 1 start in 25).
//
// A C constructor, run when the binary is loaded, before the Go runtime starts, installs a
// handler for SIGTERM and SIGINT that writes one line and exits 0, in a PID 1 only. The
// runtime keeps it as the handler to forward to: where no channel is registered, it forwards
// the signal there before it would exit 2 (runtime.dieFromSignal, runtime.sigfwdgo). Nothing
// has been done to the node by then. Once main registers (signal.NotifyContext), the signal
// goes to main's channel and the service stops as it always does.
//
// A command run from a shell (check-root, mig plan) and the service's own children (the NVML
// jobs) are not PID 1: for them nothing changes.
package stopsignal

/*
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void stopsignal_exit(int sig) {
	static const char msg[] = "level=INFO msg=\"stopped: a stop signal came before the service started\"\n";
	(void)sig;
	(void)!write(2, msg, sizeof msg - 1);
	_exit(0);
}

__attribute__((constructor)) static void stopsignal_install(void) {
	struct sigaction sa;

	if (getpid() != 1) {
		return;
	}

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = stopsignal_exit;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
}
*/
import "C"
