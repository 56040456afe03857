package daemons

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// SyslogSink is a /dev/log stand-in: a datagram socket that takes the syslog
// lines of daemons that log nowhere else (nvidia-persistenced) and forwards
// them to a slog logger. Talos runs no syslog reader in an extension service's
// mount namespace, so without it those lines are lost.
type SyslogSink struct {
	log  *slog.Logger
	path string
	conn *net.UnixConn
}

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
	// Daemons may drop privileges (--user); let them write.
	if err := os.Chmod(path, 0o666); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("syslog socket %s: %w", path, err)
	}
	return &SyslogSink{log: logger, path: path, conn: conn}, nil
}

// Path is where the sink listens.
func (s *SyslogSink) Path() string { return s.path }

// Serve forwards messages until ctx is done, then closes and removes the socket.
func (s *SyslogSink) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = s.conn.Close() })
	defer stop()
	defer os.Remove(s.path)
	buf := make([]byte, 64<<10)
	for {
		n, err := s.conn.Read(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("syslog socket %s: %w", s.path, err)
		}
		m := ParseSyslog(string(buf[:n]))
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
