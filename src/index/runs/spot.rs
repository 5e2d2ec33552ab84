//! Where a chain block sits ([`Spot`]), and its packing into the low bits of a `u32` for
//! the tables that keep a spot per block. The bottom of `runs/`: every other part uses it.

/// Where a chain block sits: its node and its position in the node's run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spot {
    pub(super) node: u32,
    pub(super) pos: u32,
}

/// The locator's flag, in a spot's position, for a chain start (the locator's table of starts).
const START: u32 = 1 << 31;

impl Spot {
    /// The spot as the locator keeps a chain start.
    #[inline]
    pub(super) fn flagged(self) -> Spot {
        Spot {
            pos: self.pos | START,
            ..self
        }
    }

    #[inline]
    pub(super) fn is_flagged(self) -> bool {
        self.pos & START != 0
    }

    /// The spot without the locator's flag.
    #[inline]
    pub(super) fn unflagged(self) -> Spot {
        Spot {
            pos: self.pos & !START,
            ..self
        }
    }

    /// The spot at position `pos` of node `node`.
    #[inline]
    pub(crate) fn from_parts(node: u32, pos: u32) -> Spot {
        Spot { node, pos }
    }

    /// The spot in the low `node_bits` + [`POS_BITS`] bits of a `u32`, the node below the
    /// position, for the tables that keep a spot per block in 4 bytes (a source's slots,
    /// the locator's); `None` when the node needs more bits, or, under test, more than
    /// [`TEST_NODE_BITS`], so the tests' runs reach every table's fallback.
    #[inline]
    pub(crate) fn pack(self, node_bits: u32) -> Option<u32> {
        let limit = if cfg!(test) {
            TEST_NODE_BITS
        } else {
            node_bits
        };
        if (self.node >> limit) | (self.pos >> POS_BITS) != 0 {
            return None;
        }
        Some(self.node | (self.pos << node_bits))
    }

    /// The spot [`Self::pack`] put in the low bits of `bits` (the bits above them ignored).
    #[inline]
    pub(crate) fn unpack(bits: u32, node_bits: u32) -> Spot {
        Spot {
            node: bits & ((1 << node_bits) - 1),
            pos: (bits >> node_bits) & ((1 << POS_BITS) - 1),
        }
    }
}

/// Bits of a packed spot's position.
pub(crate) const POS_BITS: u32 = 8;

/// The node bits a packed spot may use under test ([`Spot::pack`]).
pub(crate) const TEST_NODE_BITS: u32 = 4;
