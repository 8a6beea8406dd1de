//! The report archive: regular files in a tar stream written by the `tar`
//! crate (ustar headers; GNU extensions where a path or a number does not fit).

use std::io::Write;

/// Write `files` (archive path, content) as one tar stream, each file mode
/// 0600 owned by root and stamped `mtime`.
pub fn write(
    out: &mut impl Write,
    files: &[(String, Vec<u8>)],
    mtime: u64,
) -> Result<(), crate::error::Error> {
    use crate::error::Error;
    let mut archive = tar::Builder::new(out);
    for (name, body) in files {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o600);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(mtime);
        header.set_size(body.len() as u64);
        archive
            .append_data(&mut header, name, body.as_slice())
            .map_err(|source| Error::Archive {
                entry: Some(name.clone()),
                source,
            })?;
    }
    archive
        .into_inner()
        .and_then(|out| out.flush())
        .map_err(|source| Error::Archive {
            entry: None,
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn read_back(buf: &[u8]) -> Vec<(String, u64, u32, Vec<u8>)> {
        let mut archive = tar::Archive::new(buf);
        let mut out = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let mtime = entry.header().mtime().unwrap();
            let mode = entry.header().mode().unwrap();
            let mut body = Vec::new();
            entry.read_to_end(&mut body).unwrap();
            out.push((path, mtime, mode, body));
        }
        out
    }

    #[test]
    fn files_come_back_with_their_path_content_mode_and_mtime() {
        let mut buf = Vec::new();
        let files = [
            ("r/a.txt".to_string(), b"hello".to_vec()),
            ("r/empty".to_string(), Vec::new()),
        ];
        write(&mut buf, &files, 1_700_000_000).unwrap();
        assert_eq!(buf.len() % 512, 0);
        assert_eq!(
            read_back(&buf),
            vec![
                ("r/a.txt".into(), 1_700_000_000, 0o600, b"hello".to_vec()),
                ("r/empty".into(), 1_700_000_000, 0o600, Vec::new()),
            ]
        );
    }

    #[test]
    fn a_path_longer_than_ustar_prefix_and_name_is_kept_whole() {
        // 300 bytes: more than ustar's 155-byte prefix plus 100-byte name.
        let long = format!("r/{}/{}", "d".repeat(200), "f".repeat(96));
        let mut buf = Vec::new();
        write(&mut buf, &[(long.clone(), b"x".to_vec())], 0).unwrap();
        let back = read_back(&buf);
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].0, long);
        assert_eq!(back[0].3, b"x");
    }

    #[test]
    fn an_mtime_wider_than_eleven_octal_digits_is_not_truncated() {
        // 8^11 seconds does not fit the 11 octal digits of a ustar field.
        let mtime = 8u64.pow(11) + 5;
        let mut buf = Vec::new();
        write(&mut buf, &[("r/late".into(), b"y".to_vec())], mtime).unwrap();
        assert_eq!(read_back(&buf)[0].1, mtime);
    }

    /// A writer that fails: the error names the entry being written and
    /// keeps the OS error.
    #[test]
    fn a_failed_write_names_the_entry_and_keeps_the_os_error() {
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        match write(&mut Full, &[("r/a.txt".into(), b"x".to_vec())], 0) {
            Err(crate::error::Error::Archive { entry, source }) => {
                assert_eq!(entry.as_deref(), Some("r/a.txt"));
                assert_eq!(source.raw_os_error(), Some(libc::ENOSPC));
            }
            other => panic!("{other:?}"),
        }
    }
}
