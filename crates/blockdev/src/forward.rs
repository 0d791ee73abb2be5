//! `forward_block_device!`: the one way a `BlockDevice` decorator passes the
//! trait's methods to the device it wraps.
//!
//! A decorator (a fence, a meter, a switch between owners) changes one or
//! two methods and passes the rest on. Written by hand, a method it forgot
//! to pass on silently takes the trait's default, and reads the same as one
//! it meant to leave alone. The macro generates a forward for every method
//! of the trait, except the ones the impl names: each method is either
//! forwarded or visibly its own. A method added to the trait is added here,
//! so every decorator forwards it without being edited.

/// Generates, inside an `impl BlockDevice for X` block, every `BlockDevice`
/// method as a forward to an inner device, except the methods listed after
/// `except`, which the impl writes itself (or, said in a comment there,
/// leaves to the trait's default).
///
/// Two forms:
/// - `forward_block_device!(self => self.inner, except [submit, describe]);`
///   forwards to `self.inner` (anything that derefs to a `BlockDevice`).
/// - `forward_block_device!(self => if let Some(d) = self.active(), except [...]);`
///   forwards to `d` while the expression is `Some`, and answers with the
///   trait's defaults while it is `None` (a decorator with no device below
///   it for now). The trait's required methods (`geometry`, `submit`,
///   `deallocate_reads_zeroes`, `describe`) have no default, so this form
///   must list them in `except`.
///
/// `self` is passed in so the generated methods and the inner expression
/// name the same receiver.
///
/// ```
/// use blockdev::BlockDevice;
///
/// struct Quiet(Box<dyn BlockDevice>);
///
/// impl BlockDevice for Quiet {
///     blockdev::forward_block_device!(self => self.0, except [describe]);
///
///     fn describe(&self) -> String {
///         "quiet".into()
///     }
/// }
/// ```
///
/// A name that is no method of the trait is an error, not a silent forward:
///
/// ```compile_fail
/// struct Typo(Box<dyn blockdev::BlockDevice>);
///
/// impl blockdev::BlockDevice for Typo {
///     blockdev::forward_block_device!(self => self.0, except [descibe]);
/// }
/// ```
///
/// and so is the optional form without the required methods of its own:
///
/// ```compile_fail
/// struct Standby(Option<Box<dyn blockdev::BlockDevice>>);
///
/// impl blockdev::BlockDevice for Standby {
///     blockdev::forward_block_device!(self => if let Some(d) = self.0.as_ref(), except [submit]);
/// }
/// ```
#[macro_export]
macro_rules! forward_block_device {
    ($s:ident => if let Some($d:ident) = $opt:expr $(, except [$($ex:ident),* $(,)?])? $(,)?) => {
        $($($crate::forward_block_device!(@known $ex);)*)?
        $crate::forward_block_device!(@all $s [$($($ex)*)?] (opt $d $opt));
    };
    ($s:ident => $inner:expr $(, except [$($ex:ident),* $(,)?])? $(,)?) => {
        $($($crate::forward_block_device!(@known $ex);)*)?
        $crate::forward_block_device!(@all $s [$($($ex)*)?] (to $inner));
    };

    // Every method of the trait, each emitted unless listed.
    (@all $s:ident $ex:tt $t:tt) => {
        $crate::forward_block_device!(@not geometry $ex { $s $t geometry () -> $crate::Geometry ; required });
        $crate::forward_block_device!(@not submit $ex { $s $t submit (req: $crate::IoRequest) -> $crate::IoFuture ; required });
        $crate::forward_block_device!(@not prefetch $ex { $s $t prefetch (lba: u64, blocks: u32) ; {} });
        $crate::forward_block_device!(@not deallocate_reads_zeroes $ex { $s $t deallocate_reads_zeroes () -> bool ; required });
        $crate::forward_block_device!(@not allocated_blocks $ex { $s $t allocated_blocks () -> Option<u64> ; { None } });
        $crate::forward_block_device!(@not read_only $ex { $s $t read_only () -> bool ; { false } });
        $crate::forward_block_device!(@not describe $ex { $s $t describe () -> String ; required });
        $crate::forward_block_device!(@not shutdown $ex { $s $t shutdown () -> Result<(), $crate::BlockError> ; { Ok(()) } });
        $crate::forward_block_device!(@not keeps_records $ex { $s $t keeps_records () -> bool ; { false } });
        $crate::forward_block_device!(@not load_record $ex { $s $t load_record (kind: $crate::RecordKind) -> Result<Option<Vec<u8>>, $crate::BlockError> ; { Ok(None) } });
        $crate::forward_block_device!(@not store_record $ex { $s $t store_record (kind: $crate::RecordKind, data: &[u8]) -> Result<(), $crate::BlockError> ;
            { Err($crate::BlockError::Config(format!("{} keeps no {kind:?} record", $crate::BlockDevice::describe($s)))) } });
    };

    // `@not NAME [LIST] { .. }`: the method unless NAME is in LIST. A listed
    // name only matches its own literal arm, so each method has one.
    (@not geometry [geometry $($r:ident)*] $m:tt) => {};
    (@not submit [submit $($r:ident)*] $m:tt) => {};
    (@not prefetch [prefetch $($r:ident)*] $m:tt) => {};
    (@not deallocate_reads_zeroes [deallocate_reads_zeroes $($r:ident)*] $m:tt) => {};
    (@not allocated_blocks [allocated_blocks $($r:ident)*] $m:tt) => {};
    (@not read_only [read_only $($r:ident)*] $m:tt) => {};
    (@not describe [describe $($r:ident)*] $m:tt) => {};
    (@not shutdown [shutdown $($r:ident)*] $m:tt) => {};
    (@not keeps_records [keeps_records $($r:ident)*] $m:tt) => {};
    (@not load_record [load_record $($r:ident)*] $m:tt) => {};
    (@not store_record [store_record $($r:ident)*] $m:tt) => {};
    (@not $n:ident [$other:ident $($r:ident)*] $m:tt) => {
        $crate::forward_block_device!(@not $n [$($r)*] $m);
    };
    (@not $n:ident [] { $($m:tt)* }) => {
        $crate::forward_block_device!(@emit $($m)*);
    };

    // Forward to an expression. Method-call syntax, so whatever derefs to a
    // device (a box, an `Arc<dyn BlockDevice>`, a field) works as the target.
    (@emit $s:ident (to $inner:expr) $name:ident ($($a:ident : $ty:ty),*) $(-> $ret:ty)? ; $default:tt) => {
        fn $name(&$s, $($a: $ty),*) $(-> $ret)? {
            #[allow(unused_imports)] // in scope already where the impl names the trait
            use $crate::BlockDevice as _;
            ($inner).$name($($a),*)
        }
    };
    // Forward while there is a device; a required method has no answer without one.
    (@emit $s:ident (opt $d:ident $opt:expr) $name:ident ($($a:ident : $ty:ty),*) $(-> $ret:ty)? ; required) => {
        compile_error!(concat!(
            "forward_block_device!(.. if let Some ..) must list `",
            stringify!($name),
            "` in except: the trait has no default for it"
        ));
    };
    (@emit $s:ident (opt $d:ident $opt:expr) $name:ident ($($a:ident : $ty:ty),*) $(-> $ret:ty)? ; $default:block) => {
        fn $name(&$s, $($a: $ty),*) $(-> $ret)? {
            #[allow(unused_imports)] // in scope already where the impl names the trait
            use $crate::BlockDevice as _;
            match $opt {
                Some($d) => $d.$name($($a),*),
                None => $default,
            }
        }
    };

    // A name in `except` that is no method of the trait (a typo would
    // otherwise forward the method it meant to keep).
    (@known geometry) => {};
    (@known submit) => {};
    (@known prefetch) => {};
    (@known deallocate_reads_zeroes) => {};
    (@known allocated_blocks) => {};
    (@known read_only) => {};
    (@known describe) => {};
    (@known shutdown) => {};
    (@known keeps_records) => {};
    (@known load_record) => {};
    (@known store_record) => {};
    (@known $other:ident) => {
        compile_error!(concat!("`", stringify!($other), "` is not a BlockDevice method"));
    };
}

#[cfg(test)]
#[path = "forward_tests.rs"]
mod tests;
