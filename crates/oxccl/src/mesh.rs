//! [`DeviceMesh`]: the ranks of a communicator arranged as an N-dimensional named grid, with
//! one sub-communicator per dimension (like torch's `init_device_mesh`).
//!
//! Ranks are laid out row-major (the last dimension varies fastest). Along each dimension a
//! rank belongs to the group of ranks that share all its other coordinates, and its rank in
//! that group is its coordinate along the dimension. For a mesh `[("dp", 2), ("tp", 2)]` over
//! 4 ranks, the tensor-parallel groups are {0, 1} and {2, 3}, the data-parallel groups
//! {0, 2} and {1, 3}.
//!
//! ```
//! use oxccl::{DeviceMesh, ReduceOp};
//! let out = oxccl::local::run(4, |comm| -> oxccl::Result<(Vec<usize>, i32)> {
//!     let mesh = DeviceMesh::new(&comm, &[("dp", 2), ("tp", 2)])?;
//!     let mut x = [comm.rank() as i32];
//!     mesh.group("tp")?.all_reduce(&mut x, ReduceOp::Sum)?;
//!     Ok((mesh.coordinate().to_vec(), x[0]))
//! }).unwrap();
//! assert_eq!(out[3].as_ref().unwrap(), &(vec![1, 1], 2 + 3));
//! ```

use crate::communicator::Communicator;
use crate::error::{Error, Result};

/// An N-dimensional named mesh over the ranks of a communicator, with one sub-communicator
/// per dimension. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct DeviceMesh {
    world: Communicator,
    dims: Vec<(String, usize)>,
    coordinate: Vec<usize>,
    /// `groups[i]`: the ranks that share every coordinate except the i-th.
    groups: Vec<Communicator>,
}

impl DeviceMesh {
    /// Arranges the ranks of `comm` as a mesh with the named dimensions `dims` (outermost
    /// first) and creates the sub-communicator of every dimension, with one
    /// [`split`](Communicator::split) per dimension. Collective: every rank of `comm` must
    /// call it with the same `dims`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `dims` is empty, a name is empty or repeated, a size is
    /// 0, or the product of the sizes is not `comm.world_size()` (checked before any
    /// communication, so a rank that passes different `dims` leaves the others waiting in the
    /// first split until their timeout); communication errors of the splits.
    pub fn new(comm: &Communicator, dims: &[(&str, usize)]) -> Result<DeviceMesh> {
        let n = comm.world_size();
        if dims.is_empty() {
            return Err(Error::invalid("DeviceMesh::new: the mesh needs at least one dimension"));
        }
        for (i, &(name, size)) in dims.iter().enumerate() {
            if name.is_empty() {
                return Err(Error::invalid(format!("DeviceMesh::new: dimension {i} has an empty name")));
            }
            if dims[..i].iter().any(|&(other, _)| other == name) {
                return Err(Error::invalid(format!("DeviceMesh::new: the dimension name `{name}` is used twice")));
            }
            if size == 0 {
                return Err(Error::invalid(format!("DeviceMesh::new: dimension `{name}` has size 0")));
            }
        }
        let product = dims.iter().try_fold(1usize, |a, &(_, s)| a.checked_mul(s));
        if product != Some(n) {
            let shape: Vec<String> = dims.iter().map(|(name, s)| format!("{name}={s}")).collect();
            let product = product.map_or_else(|| "more than usize::MAX".to_string(), |p| p.to_string());
            return Err(Error::invalid(format!(
                "DeviceMesh::new: the mesh [{}] has {product} positions but the communicator has {n} ranks",
                shape.join(", ")
            )));
        }
        let sizes: Vec<usize> = dims.iter().map(|&(_, s)| s).collect();
        let coordinate = unravel(comm.rank(), &sizes);
        let mut groups = Vec::with_capacity(dims.len());
        for (i, &(name, size)) in dims.iter().enumerate() {
            // Row-major linear index of the other coordinates: the same for every group member.
            let color = sizes
                .iter()
                .zip(&coordinate)
                .enumerate()
                .filter(|&(j, _)| j != i)
                .fold(0usize, |a, (_, (&s, &c))| a * s + c);
            let color = u32::try_from(color).map_err(|_| {
                Error::invalid(format!("DeviceMesh::new: dimension `{name}` needs more than 2^32 groups"))
            })?;
            let key = i64::try_from(coordinate[i])
                .map_err(|_| Error::invalid(format!("DeviceMesh::new: coordinate along `{name}` exceeds i64")))?;
            let group = comm.split(Some(color), key)?.ok_or_else(|| {
                Error::invalid(format!("DeviceMesh::new: split for `{name}` gave no communicator (internal error)"))
            })?;
            if group.world_size() != size || group.rank() != coordinate[i] {
                return Err(Error::invalid(format!(
                    "DeviceMesh::new: the `{name}` group has rank {} of {} where coordinate {} of {size} was expected \
                     (internal error)",
                    group.rank(),
                    group.world_size(),
                    coordinate[i]
                )));
            }
            groups.push(group);
        }
        let dims = dims.iter().map(|&(name, s)| (name.to_string(), s)).collect();
        Ok(DeviceMesh { world: comm.clone(), dims, coordinate, groups })
    }

    /// The dimensions, outermost first, as `(name, size)`.
    pub fn dims(&self) -> &[(String, usize)] {
        &self.dims
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.dims.len()
    }

    /// This rank's coordinate along every dimension (outermost first).
    pub fn coordinate(&self) -> &[usize] {
        &self.coordinate
    }

    /// The communicator the mesh was built over.
    pub fn world(&self) -> &Communicator {
        &self.world
    }

    fn index(&self, name: &str) -> Result<usize> {
        self.dims.iter().position(|(n, _)| n == name).ok_or_else(|| {
            let names: Vec<&str> = self.dims.iter().map(|(n, _)| n.as_str()).collect();
            Error::invalid(format!("DeviceMesh: no dimension named `{name}`; the mesh has {}", names.join(", ")))
        })
    }

    /// The size of dimension `name`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the mesh has no dimension `name`.
    pub fn size(&self, name: &str) -> Result<usize> {
        Ok(self.dims[self.index(name)?].1)
    }

    /// This rank's coordinate along dimension `name` (its rank in [`group(name)`](Self::group)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the mesh has no dimension `name`.
    pub fn coordinate_of(&self, name: &str) -> Result<usize> {
        Ok(self.coordinate[self.index(name)?])
    }

    /// The communicator of the ranks that share every coordinate of this rank except the one
    /// along `name`; its rank order is the coordinate along `name`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the mesh has no dimension `name`.
    pub fn group(&self, name: &str) -> Result<&Communicator> {
        Ok(&self.groups[self.index(name)?])
    }

    /// The rank (in the mesh's communicator) at `coordinate`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `coordinate` has the wrong number of entries or one is
    /// out of range.
    pub fn rank_at(&self, coordinate: &[usize]) -> Result<usize> {
        if coordinate.len() != self.dims.len() {
            return Err(Error::invalid(format!(
                "DeviceMesh::rank_at: {} coordinates for a mesh of {} dimensions",
                coordinate.len(),
                self.dims.len()
            )));
        }
        let mut rank = 0;
        for (&c, (name, size)) in coordinate.iter().zip(&self.dims) {
            if c >= *size {
                return Err(Error::invalid(format!(
                    "DeviceMesh::rank_at: coordinate {c} is out of range for dimension `{name}` of size {size}"
                )));
            }
            rank = rank * size + c;
        }
        Ok(rank)
    }
}

/// The row-major coordinate of `rank` in a grid of `sizes` (last dimension fastest).
fn unravel(mut rank: usize, sizes: &[usize]) -> Vec<usize> {
    let mut c = vec![0; sizes.len()];
    for (ci, &s) in c.iter_mut().zip(sizes).rev() {
        *ci = rank % s;
        rank /= s;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local;
    use crate::reduce_op::ReduceOp;

    /// The world ranks of the group along `dim` containing `rank`, from coordinates alone.
    fn expected_members(rank: usize, sizes: &[usize], dim: usize) -> Vec<usize> {
        let c = unravel(rank, sizes);
        (0..sizes[dim])
            .map(|k| {
                let mut c = c.clone();
                c[dim] = k;
                c.iter().zip(sizes).fold(0, |a, (&ci, &s)| a * s + ci)
            })
            .collect()
    }

    const MESHES: &[&[(&str, usize)]] = &[
        &[("dp", 2), ("tp", 2)],
        &[("dp", 2), ("tp", 3)],
        &[("dp", 3), ("tp", 2)],
        &[("pp", 2), ("dp", 2), ("tp", 2)],
        &[("a", 1), ("b", 3), ("c", 2)],
        &[("only", 5)],
    ];

    #[test]
    fn unravel_is_row_major() {
        assert_eq!(unravel(5, &[2, 3]), vec![1, 2]);
        assert_eq!(unravel(3, &[2, 2, 2]), vec![0, 1, 1]);
        assert_eq!(expected_members(0, &[2, 2], 1), vec![0, 1]);
        assert_eq!(expected_members(1, &[2, 2], 0), vec![1, 3]);
    }

    #[test]
    fn groups_have_the_expected_members() {
        for dims in MESHES {
            let sizes: Vec<usize> = dims.iter().map(|d| d.1).collect();
            let n = sizes.iter().product();
            let res = local::run(n, |comm| -> Result<()> {
                let mesh = DeviceMesh::new(&comm, dims)?;
                let me = comm.rank();
                assert_eq!(mesh.coordinate(), &unravel(me, &sizes)[..]);
                assert_eq!(mesh.rank_at(mesh.coordinate())?, me);
                assert_eq!(mesh.ndim(), dims.len());
                assert_eq!(mesh.world().world_size(), n);
                for (i, &(name, size)) in dims.iter().enumerate() {
                    assert_eq!(mesh.dims()[i], (name.to_string(), size));
                    assert_eq!(mesh.size(name)?, size);
                    let g = mesh.group(name)?;
                    assert_eq!((g.rank(), g.world_size()), (mesh.coordinate()[i], size));
                    assert_eq!(mesh.coordinate_of(name)?, mesh.coordinate()[i]);
                    let mut members = vec![0u64; size];
                    g.all_gather(&[me as u64], &mut members)?;
                    let want: Vec<u64> = expected_members(me, &sizes, i).into_iter().map(|r| r as u64).collect();
                    assert_eq!(members, want, "mesh {dims:?} dim {name} rank {me}");
                }
                Ok(())
            })
            .unwrap();
            assert!(res.iter().all(Result::is_ok), "{dims:?}: {res:?}");
        }
    }

    #[test]
    fn two_by_two_matches_the_documented_groups() {
        let res = local::run(4, |comm| -> Result<(Vec<u32>, Vec<u32>)> {
            let mesh = DeviceMesh::new(&comm, &[("dp", 2), ("tp", 2)])?;
            let mut tp = vec![0u32; 2];
            let mut dp = vec![0u32; 2];
            mesh.group("tp")?.all_gather(&[comm.rank() as u32], &mut tp)?;
            mesh.group("dp")?.all_gather(&[comm.rank() as u32], &mut dp)?;
            Ok((tp, dp))
        })
        .unwrap();
        let res: Vec<_> = res.into_iter().map(Result::unwrap).collect();
        assert_eq!(res[0], (vec![0, 1], vec![0, 2]));
        assert_eq!(res[1], (vec![0, 1], vec![1, 3]));
        assert_eq!(res[2], (vec![2, 3], vec![0, 2]));
        assert_eq!(res[3], (vec![2, 3], vec![1, 3]));
    }

    /// Collectives on every dimension's group at the same time, from one thread per group
    /// inside each rank, must not see each other's messages.
    #[test]
    fn concurrent_groups_do_not_interfere() {
        const ROUNDS: usize = 50;
        for dims in MESHES {
            let sizes: Vec<usize> = dims.iter().map(|d| d.1).collect();
            let n = sizes.iter().product();
            let res = local::run(n, |comm| -> Result<()> {
                let mesh = DeviceMesh::new(&comm, dims)?;
                let me = comm.rank() as i64;
                std::thread::scope(|s| {
                    let handles: Vec<_> = (0..dims.len())
                        .map(|i| {
                            let mesh = &mesh;
                            let sizes = &sizes;
                            s.spawn(move || -> Result<()> {
                                let g = mesh.group(dims[i].0)?;
                                let members = expected_members(me as usize, sizes, i);
                                for round in 0..ROUNDS as i64 {
                                    // Vary the length so messages of different groups differ.
                                    let len = 1 + (round as usize * 7 + i * 13) % 300;
                                    let mut x: Vec<i64> = (0..len as i64).map(|k| me * 1000 + k + round).collect();
                                    g.all_reduce(&mut x, ReduceOp::Sum)?;
                                    let want =
                                        |k: i64| members.iter().map(|&r| r as i64 * 1000 + k + round).sum::<i64>();
                                    for (k, v) in x.iter().enumerate() {
                                        assert_eq!(*v, want(k as i64), "dim {i} round {round}");
                                    }
                                    let mut ranks = vec![0i64; members.len()];
                                    g.all_gather(&[me + round], &mut ranks)?;
                                    let want: Vec<i64> = members.iter().map(|&r| r as i64 + round).collect();
                                    assert_eq!(ranks, want);
                                }
                                Ok(())
                            })
                        })
                        .collect();
                    handles.into_iter().try_for_each(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                })
            })
            .unwrap();
            assert!(res.iter().all(Result::is_ok), "{dims:?}: {res:?}");
        }
    }

    #[test]
    fn async_on_two_groups_overlaps() {
        let res = local::run(4, |comm| -> Result<()> {
            let mesh = DeviceMesh::new(&comm, &[("dp", 2), ("tp", 2)])?;
            let (tp, dp) = (mesh.group("tp")?, mesh.group("dp")?);
            let r = comm.rank() as f32;
            let mut a = vec![r; 1000];
            let mut b = vec![r; 1000];
            dp.scope(|sd| {
                let wd = sd.all_reduce(&mut a, ReduceOp::Sum)?;
                tp.scope(|st| {
                    let wt = st.all_reduce(&mut b, ReduceOp::Max)?;
                    let b = wt.wait()?;
                    assert_eq!(b[999], (mesh.coordinate()[0] * 2 + 1) as f32);
                    Ok(())
                })?;
                let a = wd.wait()?;
                assert_eq!(a[0], (2 * mesh.coordinate()[1] + 2) as f32);
                Ok(())
            })
        })
        .unwrap();
        assert!(res.iter().all(Result::is_ok), "{res:?}");
    }

    #[test]
    fn argument_errors() {
        let res = local::run(4, |comm| -> Result<()> {
            let invalid = |r: Result<DeviceMesh>, what: &str| match r {
                Err(Error::InvalidArgument(m)) => assert!(m.contains(what), "{m}"),
                other => panic!("expected an argument error about {what}, got {other:?}"),
            };
            invalid(DeviceMesh::new(&comm, &[("dp", 2), ("tp", 3)]), "6 positions");
            invalid(DeviceMesh::new(&comm, &[("dp", 8)]), "4 ranks");
            invalid(DeviceMesh::new(&comm, &[("a", usize::MAX), ("b", 2)]), "more than");
            invalid(DeviceMesh::new(&comm, &[("tp", 2), ("tp", 2)]), "used twice");
            invalid(DeviceMesh::new(&comm, &[("", 2), ("tp", 2)]), "empty name");
            invalid(DeviceMesh::new(&comm, &[("dp", 0), ("tp", 4)]), "size 0");
            invalid(DeviceMesh::new(&comm, &[]), "at least one");
            // The communicator is still usable, and lookups of unknown names fail cleanly.
            let mesh = DeviceMesh::new(&comm, &[("dp", 2), ("tp", 2)])?;
            for r in [mesh.size("pp").map(drop), mesh.group("pp").map(drop), mesh.coordinate_of("").map(drop)] {
                assert!(matches!(r, Err(Error::InvalidArgument(ref m)) if m.contains("dp, tp")), "{r:?}");
            }
            assert!(matches!(mesh.rank_at(&[1]), Err(Error::InvalidArgument(_))));
            assert!(matches!(mesh.rank_at(&[0, 2]), Err(Error::InvalidArgument(_))));
            Ok(())
        })
        .unwrap();
        assert!(res.iter().all(Result::is_ok), "{res:?}");
    }
}
