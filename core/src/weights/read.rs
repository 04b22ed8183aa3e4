//! Positioned reads, the one way both checkpoint formats read their files (no memory map: see
//! the safetensors module for why).

use std::fs::File;

/// Reads exactly `buf.len()` bytes at `offset` (an `UnexpectedEof` error if the file is shorter).
pub fn read_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(f, buf, offset)
    }
    #[cfg(windows)]
    {
        let (mut done, mut at) = (0, offset);
        while done < buf.len() {
            match std::os::windows::fs::FileExt::seek_read(f, &mut buf[done..], at)? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                n => (done, at) = (done + n, at + n as u64),
            }
        }
        Ok(())
    }
}
