//! Skeleton
