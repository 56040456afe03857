package daemons

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SyslogSink is a /dev/log stand-in: a datagram socket that takes the syslog
// lines of daemons that log nowhere else (nvidia-persistenced) and forwards
// them to a slog logger. Talos runs no syslog reader in an extension service's
// mount namespace, so without it those lines are lost.
//
// The socket is the host's /dev/log (the service's /dev is the host's), so it takes
// only what our daemons send: lines tagged as one of them, at most syslogBurst at once
// and syslogRate a second after that; the rest is dropped and counted.
type SyslogSink struct {
	log  *slog.Logger
	path string
	conn *net.UnixConn

	mu   sync.Mutex
	last map[string]lastLines // by tag
}

// lastLines are a daemon's last message and its last one of severity warning or worse.
type lastLines struct{ any, bad string }

// syslogTags are the syslog tags of the daemons we run that log to syslog:
// nvidia-persistenced openlog()s with its name (nv-fabricmanager logs to its stderr,
// LOG_USE_SYSLOG=0, see FabricManager).
func syslogTags() []string { return []string{"nvidia-persistenced"} }

// The rate limit: nvidia-persistenced logs a few lines a start, and some a second with
// --verbose; a flood from elsewhere must not fill the service's log.
const (
	syslogBurst = 100
	syslogRate  = 20 // lines a second once the burst is spent
	// syslogDropReport is how often drops are reported while they go on.
	syslogDropReport = time.Minute
)

// ListenSyslog listens on path (normally /dev/log inside the service). It
// refuses to replace a socket that someone answers on, or anything that is
// not a socket; a dead socket is replaced.
func ListenSyslog(logger *slog.Logger, path string) (*SyslogSink, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("syslog socket %s: exists and is not a socket (%s)", path, fi.Mode().Type())
		}
		if c, err := net.Dial("unixgram", path); err == nil {
			_ = c.Close()
			return nil, fmt.Errorf("syslog socket %s: another syslog reader is listening; leaving it alone", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("syslog socket %s: remove dead socket: %w", path, err)
		}
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("syslog socket %s: %w", path, err)
	}
	// Sending to a UNIX socket needs write permission on it. Our daemons run as root
	// (nvidia-persistenced gets no --user), so the owner's is the only write permission
	// it needs; 0666, the mode of a host's syslog socket, would let every user of the
	// host write into the service's log.
	if err := os.Chmod(path, 0o600); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("syslog socket %s: %w", path, err)
	}
	return &SyslogSink{log: logger, path: path, conn: conn, last: map[string]lastLines{}}, nil
}

// LastLine returns the last message of severity warning or worse that the daemon with this
// syslog tag sent, else its last message, "" if none: what says why a daemon is down
// ("Failed to query NVIDIA devices"), not its "Shutdown" that follows.
func (s *SyslogSink) LastLine(tag string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.last[tag]; l.bad != "" {
		return l.bad
	}
	return s.last[tag].any
}

// Path is where the sink listens.
func (s *SyslogSink) Path() string { return s.path }

// Serve forwards messages until ctx is done, then closes and removes the socket.
func (s *SyslogSink) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = s.conn.Close() })
	defer stop()
	defer os.Remove(s.path)
	buf := make([]byte, 64<<10)
	tags := syslogTags()
	tokens, filled := float64(syslogBurst), time.Now()
	var foreign, limited int
	reported := time.Now()
	report := func() {
		if foreign+limited > 0 {
			s.log.Warn("syslog lines dropped", "foreignTag", foreign, "rateLimited", limited, "acceptedTags", tags)
		}
		foreign, limited, reported = 0, 0, time.Now()
	}
	defer report()
	for {
		n, err := s.conn.Read(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("syslog socket %s: %w", s.path, err)
		}
		now := time.Now()
		tokens = min(syslogBurst, tokens+now.Sub(filled).Seconds()*syslogRate)
		filled = now
		m := ParseSyslog(string(buf[:n]))
		accepted := false
		switch {
		case !slices.Contains(tags, m.Tag):
			foreign++
		case tokens < 1:
			limited++
		default:
			tokens--
			accepted = true
		}
		// Drops are reported with the next line taken, or once a while as they go on.
		if accepted || now.Sub(reported) >= syslogDropReport {
			report()
		}
		if !accepted {
			continue
		}
		s.mu.Lock()
		l := s.last[m.Tag]
		l.any = m.Message
		if m.Severity <= 4 {
			l.bad = m.Message
		}
		s.last[m.Tag] = l
		s.mu.Unlock()
		attrs := []any{"source", "syslog", "tag", m.Tag}
		if m.PID != 0 {
			attrs = append(attrs, "pid", m.PID)
		}
		s.log.Log(ctx, m.Level(), m.Message, attrs...)
	}
}

// SyslogMessage is one parsed syslog datagram.
type SyslogMessage struct {
	Facility, Severity int
	Tag                string
	PID                int
	Message            string
}

// Level maps the syslog severity onto slog levels.
func (m SyslogMessage) Level() slog.Level {
	switch {
	case m.Severity <= 3: // emerg, alert, crit, err
		return slog.LevelError
	case m.Severity == 4:
		return slog.LevelWarn
	case m.Severity <= 6:
		return slog.LevelInfo
	default:
		return slog.LevelDebug
	}
}

// ParseSyslog parses what glibc's syslog(3) sends to /dev/log:
// "<PRI>Mmm dd hh:mm:ss TAG[PID]: MSG". Parts it cannot find are left empty
// and the rest goes into Message, so that no line is dropped.
func ParseSyslog(s string) SyslogMessage {
	m := SyslogMessage{Severity: 6, Facility: 1}
	s = strings.TrimRight(s, "\n\x00")
	if strings.HasPrefix(s, "<") {
		if end := strings.IndexByte(s, '>'); end > 1 && end <= 4 {
			if pri, err := strconv.Atoi(s[1:end]); err == nil {
				m.Facility, m.Severity = pri/8, pri%8
				s = s[end+1:]
			}
		}
	}
	if len(s) >= len(time.Stamp)+1 {
		if _, err := time.Parse(time.Stamp, s[:len(time.Stamp)]); err == nil && s[len(time.Stamp)] == ' ' {
			s = s[len(time.Stamp)+1:]
		}
	}
	if tag, rest, ok := strings.Cut(s, ": "); ok && !strings.ContainsAny(tag, " ") {
		if name, pid, ok := strings.Cut(tag, "["); ok && strings.HasSuffix(pid, "]") {
			m.PID, _ = strconv.Atoi(strings.TrimSuffix(pid, "]"))
			tag = name
		}
		m.Tag, s = tag, rest
	}
	m.Message = s
	return m
}
