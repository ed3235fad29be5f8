//! The one time reproducible output uses: `SOURCE_DATE_EPOCH` when set
//! (reproducible-builds.org), else now. Read by the store (the records'
//! times) and by node images (`created`, the layer's mtimes).

use anyhow::{anyhow, bail};

/// SOURCE_DATE_EPOCH (seconds), when set: the one time reproducible builds use.
pub fn source_date_epoch() -> anyhow::Result<Option<i64>> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => {
            let secs: i64 = v
                .trim()
                .parse()
                .map_err(|_| anyhow!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds"))?;
            if chrono::DateTime::from_timestamp(secs, 0).is_none() || secs < 0 {
                bail!("SOURCE_DATE_EPOCH={v} is out of range");
            }
            Ok(Some(secs))
        }
        Err(_) => Ok(None),
    }
}

/// `created` from SOURCE_DATE_EPOCH, else now; and the tar mtime.
pub fn creation_time() -> anyhow::Result<(String, u64)> {
    let t = match source_date_epoch()? {
        Some(secs) => chrono::DateTime::from_timestamp(secs, 0).expect("checked"),
        None => chrono::Utc::now(),
    };
    Ok((
        t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        t.timestamp().max(0) as u64,
    ))
}
