//! Mirrors of the index. Redis in kthena's layout is the one backend today.
//!
//! | folder | job |
//! | --- | --- |
//! | `redis/` | the kthena-compatible Redis mirror |

pub mod redis;
