//! The log is plain text when stderr is not a terminal: `squeeze -v serve`
//! with stderr sent to a file writes no ANSI colour codes (no ESC byte)
//! there, so grep and log shippers see the words. (The offline commands
//! log nothing at -vvv; they share the one logging set-up.)

mod common;

use common::*;

#[test]
fn serve_log_file_has_no_escape_codes() {
    let w = Workdir::new();
    let srv = Serve::start(&w, &[]);
    // A connection, so the log has more than the start-up lines.
    let c = srv.client(true);
    c.disconnect();
    srv.stop();
    let log = std::fs::read_to_string(w.log()).unwrap();
    assert!(log.contains("INFO"), "the server logged nothing:\n{log}");
    assert!(!log.contains('\x1b'), "ESC in the log file:\n{log:?}");
}
