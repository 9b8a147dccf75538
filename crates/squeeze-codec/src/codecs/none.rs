//! `none`: the identity "codec". Compressing never helps (the caller stores
//! the raw bytes itself), so the compressor always answers `Ok(None)`;
//! decoding is a length-checked copy.

use squeeze_format::CodecId;

use crate::{Algorithm, CodecError, Compressor};

pub(crate) struct NoneCompressor;

impl Compressor for NoneCompressor {
    fn algorithm(&self) -> Algorithm {
        Algorithm::new(CodecId::None, 0)
    }

    fn compress(
        &mut self,
        _src: &[u8],
        dst: &mut Vec<u8>,
        _limit: usize,
    ) -> Result<Option<usize>, CodecError> {
        dst.clear();
        Ok(None)
    }
}

pub(crate) fn decode(src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    CodecError::check_len(CodecId::None, dst.len(), src.len())?;
    dst.copy_from_slice(src);
    Ok(())
}
